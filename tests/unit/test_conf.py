import pytest

from django_outbox.conf import load
from django_outbox.exceptions import ConfigurationError, UnknownDestination


def test_defaults_apply_when_setting_is_absent():
    config = load(None)
    assert config.outbox.engine.batch_size == 500
    assert config.outbox.engine.lease_seconds == 60.0
    assert (config.heartbeat_seconds, config.worker_timeout_seconds) == (1.0, 3.0)
    assert config.dispatch == "celery"
    assert config.outbox.destinations == {}


def test_destination_options_are_lowercased_and_policy_read():
    config = load(
        {
            "OUTBOX": {
                "DESTINATIONS": {
                    "orders": {"TRANSPORT": "kombu", "URL": "amqp://x", "UNCERTAIN": "hold"}
                },
            },
            "MAX_ATTEMPTS": 7,
        }
    )
    orders = config.outbox.destination("orders")
    assert orders.options == {"url": "amqp://x"}
    assert orders.uncertain == "hold"
    assert orders.max_attempts == 7
    assert orders.transport_path.endswith("kombu.KombuTransport")


def test_top_level_engine_keys_are_defaults_that_a_section_overrides():
    config = load({"BATCH_SIZE": 50, "LEASE_SECONDS": 30, "JOBS": {"BATCH_SIZE": 5}})
    assert (config.outbox.engine.batch_size, config.inbox.engine.batch_size) == (50, 50)
    assert config.jobs.engine.batch_size == 5
    assert config.engine("jobs").lease_seconds == 30.0


def destinations(value):
    return {"OUTBOX": {"DESTINATIONS": value}}


KOMBU_SOURCE = {"TRANSPORT": "kombu", "URL": "amqp://rabbit//", "QUEUE": "in"}


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ([], "must be a dict"),
        ({"BATCH_SIZ": 1}, "unknown key 'BATCH_SIZ' (did you mean 'BATCH_SIZE'?)"),
        ({"OUTBOX": {"DESTINATION": {}}}, "['OUTBOX'] has an unknown key 'DESTINATION' (did you"),
        ({"INBOX": {"DESTINATIONS": {}}}, "['INBOX'] has an unknown key 'DESTINATIONS'"),
        ({"JOBS": []}, "['JOBS'] must be a dict"),
        ({"BATCH_SIZE": 0}, "['BATCH_SIZE'] must be >= 1"),
        ({"OUTBOX": {"BATCH_SIZE": 0}}, "['OUTBOX']['BATCH_SIZE'] must be >= 1"),
        ({"BATCH_SIZE": "10"}, "BATCH_SIZE'] must be a number"),
        ({"LEASE_SECONDS": True}, "LEASE_SECONDS'] must be a number"),
        ({"DISPATCH": "kafka"}, "DISPATCH"),
        (destinations({"x": {}}), "TRANSPORT'] is required"),
        (destinations({"x": {"TRANSPORT": "memory", "UNCERTAIN": "maybe"}}), "UNCERTAIN"),
        (destinations({"x": "kombu"}), "must be a dict"),
        ({"LEASE_SECONDS": float("inf")}, "LEASE_SECONDS'] must be a finite number"),
        ({"RETRY_MAX_SECONDS": float("nan")}, "must be a finite number"),
        ({"RETRY_MAX_SECONDS": 10**12}, "RETRY_MAX_SECONDS'] must be <="),
        ({"HEARTBEAT_SECONDS": 2, "WORKER_TIMEOUT_SECONDS": 3}, "at least twice"),
        # The flat layout of 0.1 says where each key went.
        ({"DESTINATIONS": {}}, "set DJANGO_OUTBOX['OUTBOX']['DESTINATIONS'] instead"),
        ({"DELIVER_TASK_QUEUE": "q"}, "task_routes"),
        (
            {"INBOX": {"SOURCES": {"s": {"TRANSPORT": "webhook", "SECRET": "x", "ACCEPT_V1": 1}}}},
            "['SOURCES']['s']['ACCEPT_V1'] must be True or False",
        ),
        (
            {"INBOX": {"SOURCES": {"s": {**KOMBU_SOURCE, "HEARTBEAT": "60"}}}},
            "['SOURCES']['s']['HEARTBEAT'] must be a number",
        ),
        (
            {"INBOX": {"SOURCES": {"s": {**KOMBU_SOURCE, "HEARTBEAT": -1}}}},
            "['HEARTBEAT'] must be >= 0",
        ),
    ],
)
def test_wrong_settings_raise_a_clear_error(raw, fragment):
    with pytest.raises(ConfigurationError) as caught:
        load(raw)
    assert fragment in str(caught.value)


def test_unknown_destination_names_the_configured_ones_and_suggests_the_closest():
    config = load(destinations({"orders": {"TRANSPORT": "memory"}, "a": {"TRANSPORT": "memory"}}))
    with pytest.raises(UnknownDestination) as caught:
        config.outbox.destination("order")
    assert "'order' (did you mean 'orders'?)" in str(caught.value)
    assert "configured: a, orders" in str(caught.value)
