"""The Sentry recipes of docs/operations.md ("Tracing with Sentry"), run as written:

1. sentry-sdk's OpenTelemetry bridge: the spans django-outbox makes become Sentry
   transactions, and the handler's is in the producer's trace.
2. Sentry without OpenTelemetry: ``sentry-trace`` and ``baggage`` given to ``send()``
   reach the handler's ``message.headers`` across a real broker, and the handler's
   transaction continues the producer's trace.

Sentry's client sends nothing anywhere: a transport of the test keeps its envelopes.
"""

import uuid

import pytest
import sentry_sdk
from django.core.management import call_command
from sentry_sdk.integrations.opentelemetry import SentrySpanProcessor
from sentry_sdk.transport import Transport

import django_outbox
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState
from django_outbox.outbox.relay import Relay
from tests import spans as span_capture

pytestmark = pytest.mark.django_db(transaction=True)

DSN = "https://public@sentry.example/1"


class Kept(Transport):
    """A Sentry transport that keeps what the client would send."""

    def __init__(self, options=None):
        super().__init__(options)
        self.envelopes = []

    def capture_envelope(self, envelope):
        self.envelopes.append(envelope)

    def transactions(self):
        return [
            item.payload.json
            for envelope in self.envelopes
            for item in envelope.items
            if item.type == "transaction"
        ]


@pytest.fixture
def sentry():
    """Start Sentry's client with a transport of ours (``sentry(**options)``), without
    its integrations; closed and replaced by a disabled one afterwards."""

    def start(**options):
        sentry_sdk.init(
            dsn=DSN,
            transport=Kept,  # made by the client, with its options (the DSN)
            traces_sample_rate=1.0,
            default_integrations=False,
            auto_enabling_integrations=False,
            **options,
        )
        return sentry_sdk.get_client().transport

    yield start
    sentry_sdk.get_client().close()
    # Disabled again, and with no integration: sentry-sdk's default ones patch Celery,
    # Django, redis… for the rest of the process (its Celery one writes sentry-trace
    # into every task message, even without a DSN).
    sentry_sdk.init(default_integrations=False, auto_enabling_integrations=False)


def by_name(transactions, name):
    found = [t for t in transactions if t["transaction"] == name]
    assert len(found) == 1, [t["transaction"] for t in transactions]
    return found[0]["contexts"]["trace"]


def test_recipe_1_the_opentelemetry_bridge_puts_the_handler_in_the_producer_s_trace(
    sentry, configure_outbox
):
    configure_outbox(
        DESTINATIONS={"billing": {"TRANSPORT": "local", "SOURCE": "shop"}},
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}},
    )
    kept = sentry(instrumenter="otel")
    capturing = span_capture.capture()
    spans = next(capturing)
    spans.provider.add_span_processor(SentrySpanProcessor())  # the recipe's bridge
    try:
        with spans.tracer.start_as_current_span("checkout"):
            django_outbox.send("payment.captured", {"order": "o1"}, to="billing")
        assert Relay().drain().sent == 1
        assert Inbox().drain().done == 1
    finally:
        capturing.close()
    sentry_sdk.flush()
    transactions = kept.transactions()
    checkout = by_name(transactions, "checkout")
    handle = by_name(transactions, "handle payment.captured")
    assert handle["trace_id"] == checkout["trace_id"]
    assert handle["parent_span_id"] == checkout["span_id"]


# The recipe's two helpers, as docs/operations.md has them.


def sentry_headers():
    """The current Sentry trace as message headers (none outside a transaction)."""
    headers = {"sentry-trace": sentry_sdk.get_traceparent(), "baggage": sentry_sdk.get_baggage()}
    return {name: value for name, value in headers.items() if value}


def continued(message):
    """A Sentry transaction for a handler, continuing the trace its message came with."""
    transaction = sentry_sdk.continue_trace(
        message.headers, op="queue.process", name=f"handle {message.type}"
    )
    return sentry_sdk.start_transaction(transaction)


@pytest.mark.redis
def test_recipe_2_sentry_headers_cross_a_real_broker_and_the_handler_continues_the_trace(
    sentry, configure_outbox, redis_url
):
    queue = f"sentry-{uuid.uuid4().hex[:8]}"
    route = {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue}
    configure_outbox(DESTINATIONS={"billing": route}, INBOX={"SOURCES": {"billing": route}})
    kept = sentry()
    seen = []

    @handler("invoice.due")
    def invoice_due(message):
        with continued(message):
            seen.append(dict(message.headers))

    try:
        with sentry_sdk.start_transaction(op="http.server", name="checkout") as checkout:
            django_outbox.send(
                "invoice.due", {"order": "o1"}, to="billing", headers=sentry_headers()
            )
        assert Relay().drain().sent == 1
        call_command("inbox_consume", "billing", "--until-idle", "0.5")
    finally:
        unregister("invoice.due")
    assert InboxMessage.objects.get().state == InboxState.HANDLED
    assert seen[0]["sentry-trace"].startswith(f"{checkout.trace_id}-{checkout.span_id}")
    assert f"sentry-trace_id={checkout.trace_id}" in seen[0]["baggage"]
    sentry_sdk.flush()
    handle = by_name(kept.transactions(), "handle invoice.due")
    assert handle["trace_id"] == checkout.trace_id
    assert handle["parent_span_id"] == checkout.span_id


@pytest.fixture
def sentry_propagator():
    """Sentry's propagator as the global one (what its OTLP integration installs): it
    reads and writes ``sentry-trace``, not ``traceparent``."""
    from opentelemetry import propagate
    from sentry_sdk.integrations.opentelemetry import SentryPropagator

    original = propagate.get_global_textmap()
    propagate.set_global_textmap(SentryPropagator())
    yield
    propagate.set_global_textmap(original)


def test_contexts_in_sentry_s_format_are_followed_by_the_relay_and_the_handler(
    configure_outbox, sentry_propagator
):
    configure_outbox(
        DESTINATIONS={"billing": {"TRANSPORT": "local", "SOURCE": "shop"}},
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "local"}}},
    )
    producers = [f"{n:032x}-{n + 16:016x}-1" for n in (1, 2)]
    capturing = span_capture.capture()
    spans = next(capturing)
    try:
        for producer in producers:
            django_outbox.send(
                "payment.captured",
                {"order": producer},
                to="billing",
                headers={"sentry-trace": producer},
            )
        assert Relay().drain().sent == 2
        assert Inbox().drain().done == 2
    finally:
        capturing.close()
    wanted = {(int(p[:32], 16), int(p[33:49], 16)) for p in producers}
    publish = spans.one("publish billing")
    assert {(link.context.trace_id, link.context.span_id) for link in publish.links} == wanted
    handles = spans.named("handle payment.captured")
    assert {(s.context.trace_id, s.parent.span_id) for s in handles} == wanted
