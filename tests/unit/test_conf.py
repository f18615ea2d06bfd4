import pytest

from django_outbox.conf import load
from django_outbox.exceptions import ConfigurationError, UnknownDestination


def test_defaults_apply_when_setting_is_absent():
    config = load(None)
    assert config.batch_size == 500
    assert config.lease_seconds == 60.0
    assert config.dispatch == "celery"
    assert config.destinations == {}


def test_destination_options_are_lowercased_and_policy_read():
    config = load(
        {
            "DESTINATIONS": {
                "orders": {"TRANSPORT": "kombu", "URL": "amqp://x", "UNCERTAIN": "hold"}
            },
            "MAX_ATTEMPTS": 7,
        }
    )
    orders = config.destination("orders")
    assert orders.options == {"url": "amqp://x"}
    assert orders.uncertain == "hold"
    assert orders.max_attempts == 7
    assert orders.transport_path.endswith("kombu.KombuTransport")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ([], "must be a dict"),
        ({"BATCH_SIZ": 1}, "unknown keys: BATCH_SIZ"),
        ({"BATCH_SIZE": 0}, "BATCH_SIZE must be >= 1"),
        ({"BATCH_SIZE": "10"}, "BATCH_SIZE must be a number"),
        ({"LEASE_SECONDS": True}, "LEASE_SECONDS must be a number"),
        ({"DISPATCH": "kafka"}, "DISPATCH"),
        ({"DESTINATIONS": {"x": {}}}, "TRANSPORT'] is required"),
        ({"DESTINATIONS": {"x": {"TRANSPORT": "memory", "UNCERTAIN": "maybe"}}}, "UNCERTAIN"),
        ({"DESTINATIONS": {"x": "kombu"}}, "must be a dict"),
        ({"LEASE_SECONDS": float("inf")}, "LEASE_SECONDS must be a finite number"),
        ({"RETRY_MAX_SECONDS": float("nan")}, "must be a finite number"),
        ({"RETRY_MAX_SECONDS": 10**12}, "RETRY_MAX_SECONDS must be <="),
    ],
)
def test_wrong_settings_raise_a_clear_error(raw, fragment):
    with pytest.raises(ConfigurationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load(raw)


def test_unknown_destination_names_the_configured_ones():
    config = load({"DESTINATIONS": {"a": {"TRANSPORT": "memory"}}})
    with pytest.raises(UnknownDestination, match="'b'.*configured: a"):
        config.destination("b")
