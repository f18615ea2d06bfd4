"""The destination circuit's state machine: open, probe, close; times passed in."""

import pytest

from django_outbox.conf import load
from django_outbox.exceptions import ConfigurationError
from django_outbox.outbox.circuits import Circuit, Circuits, CircuitState, Gate


def circuit() -> Circuit:
    return Circuit("hooks", probe_seconds=0.25, probe_max_seconds=2.0)


def test_a_closed_circuit_sends_and_is_claimable():
    c = circuit()
    assert c.claimable(0.0)
    assert c.allow(0.0) is Gate.SEND


def test_a_failure_opens_it_until_the_probe_is_due():
    c = circuit()
    assert c.failed(10.0, "ConnectError") is True
    assert c.state is CircuitState.OPEN
    assert not c.claimable(10.2)
    assert c.allow(10.2) is Gate.WAIT
    assert c.claimable(10.25)


def test_only_one_caller_probes_and_others_wait_meanwhile():
    c = circuit()
    c.failed(10.0, "refused")
    assert c.allow(10.3) is Gate.PROBE
    assert c.state is CircuitState.PROBING
    assert not c.claimable(10.3)
    assert c.allow(10.3) is Gate.WAIT


def test_failed_probes_double_the_wait_up_to_the_cap():
    c = circuit()
    now = 0.0
    c.failed(now, "refused")
    waits = []
    for _ in range(6):
        now = c.probe_at
        assert c.allow(now) is Gate.PROBE
        assert c.failed(now, "refused") is False  # it was probing, not closed
        waits.append(c.probe_at - now)
    assert waits == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_a_successful_probe_closes_it_and_the_next_outage_starts_short_again():
    c = circuit()
    c.failed(0.0, "refused")
    c.allow(0.25)
    c.failed(0.25, "refused")
    assert c.allow(0.75) is Gate.PROBE
    assert c.succeeded() is True
    assert c.state is CircuitState.CLOSED
    assert c.allow(1.0) is Gate.SEND
    assert c.succeeded() is False  # already closed: nothing to report
    c.failed(5.0, "refused")
    assert c.probe_at == 5.25


def test_an_abandoned_probe_leaves_it_open_with_the_probe_due():
    c = circuit()
    c.failed(0.0, "refused")
    assert c.allow(0.3) is Gate.PROBE
    c.abandoned()
    assert c.state is CircuitState.OPEN
    assert c.allow(0.3) is Gate.PROBE


def test_the_registry_blocks_only_destinations_whose_circuit_is_open(settings, caplog):
    circuits = Circuits()
    assert circuits.blocked(0.0) == frozenset()
    assert circuits.allow("hooks", 0.0) is Gate.SEND
    circuits.failed("hooks", "ConnectError: refused", now=100.0)
    assert "destination 'hooks' is unreachable: circuit open" in caplog.text
    assert circuits.blocked(100.1) == {"hooks"}
    assert circuits.state("other") is CircuitState.CLOSED
    assert circuits.next_probe_in(100.1) == pytest.approx(0.15)
    assert circuits.blocked(100.3) == frozenset()  # the probe is due: claim it
    assert circuits.allow("hooks", 100.3) is Gate.PROBE
    assert circuits.blocked(100.3) == {"hooks"}  # probing: nobody else claims it
    circuits.succeeded("hooks", now=100.4)
    assert circuits.blocked(100.4) == frozenset()
    assert circuits.next_probe_in(100.4) is None


def test_settings_are_validated():
    outbox = load({}).outbox
    assert (
        outbox.circuit_breaker,
        outbox.circuit_probe_seconds,
        outbox.circuit_probe_max_seconds,
    ) == (True, 0.25, 2.0)
    with pytest.raises(ConfigurationError, match="CIRCUIT_BREAKER"):
        load({"OUTBOX": {"CIRCUIT_BREAKER": "yes"}})
    with pytest.raises(ConfigurationError, match="must not be below"):
        load({"OUTBOX": {"CIRCUIT_PROBE_SECONDS": 5, "CIRCUIT_PROBE_MAX_SECONDS": 1}})
    with pytest.raises(ConfigurationError, match="CIRCUIT_PROBE_SECONDS"):
        load({"OUTBOX": {"CIRCUIT_PROBE_SECONDS": 0}})
