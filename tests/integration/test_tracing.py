"""Tracing: the context current at send(), receive() and enqueue() is stored with the
row and carried by the transports; publish, receive, handle and run spans join the
producer's trace (OpenTelemetry's SDK with an in-memory exporter)."""

import json
import uuid

import pytest
from django.core.management import call_command
from django.db import transaction
from django.urls import reverse
from kombu import Connection
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

import django_outbox
from django_outbox import signing, tracing
from django_outbox.exceptions import RetryableError
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage
from django_outbox.outbox.envelope import Envelope
from django_outbox.outbox.relay import Relay
from django_outbox.outbox.transports.base import Transport
from tests.spans import capture, traceparent_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    yield from capture()


class FailingTransport(Transport):
    """Fails every message it is given (retryably)."""

    def publish_one(self, envelope: Envelope) -> None:
        raise RetryableError("broker says no")


@pytest.fixture
def traced_handler(spans):
    """A handler of ``trace.test`` that opens a span of its own and sends a message from
    inside; ``fail`` in the payload makes it raise."""

    @handler("trace.test")
    def handle(message):
        with spans.tracer.start_as_current_span("inside the handler"):
            django_outbox.send("trace.onward", {}, to="default")
        if message.payload.get("fail"):
            raise ValueError("cannot handle this one")

    yield handle
    unregister("trace.test")


def local_pipeline(configure_outbox):
    configure_outbox(
        DESTINATIONS={"peer": {"TRANSPORT": "local", "SOURCE": "peer"}, **_memory()},
        INBOX={"SOURCES": {"peer": {"TRANSPORT": "local"}}},
    )


def _memory():
    return {"default": {"TRANSPORT": "memory"}}


# -- the context stored with rows ---------------------------------------------------------


def test_send_stores_the_current_span_s_context_and_nothing_without_one(spans):
    with spans.tracer.start_as_current_span("checkout") as span:
        message = django_outbox.send("order.paid", {"n": 1})
    bare = django_outbox.send("order.paid", {"n": 2})
    stored = OutboxMessage.objects.get(pk=message.pk)
    assert stored.headers == {"traceparent": traceparent_of(span)}
    assert OutboxMessage.objects.get(pk=bare.pk).headers == {}


def test_send_stores_baggage_current_without_a_span(spans):
    # The propagator is skipped when nothing is current: baggage alone still counts.
    from opentelemetry import baggage, context

    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        message = django_outbox.send("order.paid", {})
    finally:
        context.detach(token)
    assert OutboxMessage.objects.get(pk=message.pk).headers == {"baggage": "tenant=acme"}


def test_send_stores_the_tracestate_and_keeps_a_traceparent_it_is_given(spans):
    upstream = SpanContext(
        0xABC,
        0xDEF,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )
    context = trace.set_span_in_context(NonRecordingSpan(upstream))
    with spans.tracer.start_as_current_span("checkout", context=context) as span:
        message = django_outbox.send("order.paid", {})
        given = "00-0000000000000000000000000000000a-000000000000000b-01"
        explicit = django_outbox.send("order.paid", {}, headers={"Traceparent": given})
    assert OutboxMessage.objects.get(pk=message.pk).headers == {
        "traceparent": traceparent_of(span),
        "tracestate": "vendor=v1",
    }
    assert OutboxMessage.objects.get(pk=explicit.pk).headers == {"Traceparent": given}


def test_with_tracing_off_nothing_is_stored_and_no_span_made(spans, configure_outbox):
    configure_outbox(TRACING=False)
    with spans.tracer.start_as_current_span("checkout"):
        message = django_outbox.send("order.paid", {})
        received, _ = django_outbox.receive("order.paid", {}, source="s", message_id="m-1")
    assert OutboxMessage.objects.get(pk=message.pk).headers == {}
    assert InboxMessage.objects.get(pk=received.pk).headers == {}
    assert Relay().drain().sent == 1
    assert spans.names() == ["checkout"]


def test_tracing_must_be_a_bool(configure_outbox):
    from django_outbox.conf import get_settings
    from django_outbox.exceptions import ConfigurationError

    configure_outbox(TRACING="yes")
    with pytest.raises(ConfigurationError, match=r"\['TRACING'\] must be True or False"):
        get_settings()


def test_receive_keeps_the_context_a_message_came_with_else_stores_the_current_one(spans):
    producer = "00-000000000000000000000000000000aa-00000000000000bb-01"
    with spans.tracer.start_as_current_span("consumer") as span:
        carried, _ = django_outbox.receive(
            "order.paid", {}, source="s", message_id="m-1", headers={"traceparent": producer}
        )
        plain, _ = django_outbox.receive("order.paid", {}, source="s", message_id="m-2")
    assert InboxMessage.objects.get(pk=carried.pk).headers == {"traceparent": producer}
    assert InboxMessage.objects.get(pk=plain.pk).headers == {"traceparent": traceparent_of(span)}


def test_a_stored_batch_gives_its_messages_the_current_context_unless_they_carry_one(spans):
    """``inbox_consume``'s path: the context is read once for the batch, and each
    message without a context of its own gets it."""
    from django_outbox.conf import Source
    from django_outbox.inbox.intake import Arrival, store_many

    producer = "00-000000000000000000000000000000aa-00000000000000bb-01"
    source = Source(name="s", transport="kombu")
    arrivals = [
        Arrival(source, b"{}", {"outbox-message-id": f"m-{n}", "outbox-type": "t", **extra})
        for n, extra in enumerate([{}, {"traceparent": producer}, {}])
    ]
    with spans.tracer.start_as_current_span("consumer") as span:
        stored = store_many(arrivals)
    assert len(stored.rows) == 3
    headers = {m.message_id: m.headers for m in InboxMessage.objects.all()}
    assert headers == {
        "m-0": {"traceparent": traceparent_of(span)},
        "m-1": {"traceparent": producer},
        "m-2": {"traceparent": traceparent_of(span)},
    }


def test_a_traceparent_is_parsed_strictly():
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    context = tracing.parse_traceparent(good)
    assert (context.trace_id, context.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert context.is_remote and context.trace_flags.sampled
    for bad in (
        None,
        42,
        "",
        good.upper(),
        good + "-extra",  # version 00 has exactly four fields
        "ff" + good[2:],
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "00-0af7651916cd43dd8448eb211c8031_c-b7ad6b7169203331-01",  # int() would take _
    ):
        assert tracing.parse_traceparent(bad) is None, bad
    assert tracing.parse_traceparent("01" + good[2:] + "-future") is not None


# -- spans --------------------------------------------------------------------------------


def test_the_relay_publishes_in_a_child_span_of_the_producer(spans):
    with spans.tracer.start_as_current_span("checkout") as producer:
        message = django_outbox.send("order.paid", {}, to="default")
    assert Relay().drain().sent == 1
    publish = spans.one("publish default")
    assert publish.kind == SpanKind.PRODUCER
    assert publish.context.trace_id == producer.get_span_context().trace_id
    assert publish.parent.span_id == producer.get_span_context().span_id
    assert not publish.links
    assert publish.attributes == {
        "messaging.system": "memory",
        "messaging.destination.name": "default",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.id": str(message.message_id),
    }
    assert publish.status.status_code == StatusCode.UNSET


def test_a_batch_from_several_traces_is_published_in_one_span_linked_to_each(spans):
    producers = []
    for n in range(3):
        with spans.tracer.start_as_current_span(f"request {n}") as span:
            producers.append(span.get_span_context())
            django_outbox.send("order.paid", {"n": n})
            django_outbox.send("order.paid", {"n": n, "again": True})  # same context: one link
    django_outbox.send("order.paid", {"untraced": True})
    assert Relay().drain().sent == 7
    publish = spans.one("publish default")
    assert publish.parent is None  # no span was current in the relay
    assert {(link.context.trace_id, link.context.span_id) for link in publish.links} == {
        (p.trace_id, p.span_id) for p in producers
    }
    assert publish.attributes["messaging.batch.message_count"] == 7
    assert "messaging.message.id" not in publish.attributes


def test_messages_that_fail_to_publish_set_the_span_s_status_to_error(spans, configure_outbox):
    path = f"{__name__}.FailingTransport"
    configure_outbox(DESTINATIONS={"flaky": {"TRANSPORT": path}})
    django_outbox.send("order.paid", {}, to="flaky")
    django_outbox.send("order.paid", {}, to="flaky")
    Relay().drain()
    publish = spans.one("publish flaky")
    assert publish.status.status_code == StatusCode.ERROR
    assert publish.status.description.startswith("2 of 2 message(s) failed: broker says no")
    assert [event.name for event in publish.events] == ["exception", "exception"]
    assert publish.attributes["messaging.system"] == "django_outbox"


def test_the_handler_runs_in_a_span_of_the_producer_s_trace(
    spans, configure_outbox, traced_handler
):
    local_pipeline(configure_outbox)
    with spans.tracer.start_as_current_span("checkout") as producer:
        sent = django_outbox.send("trace.test", {}, to="peer", key="k", correlation_id="c-1")
    assert Relay().drain().sent == 1
    assert Inbox().drain().done == 1
    trace_id = producer.get_span_context().trace_id
    handle = spans.one("handle trace.test")
    assert handle.kind == SpanKind.CONSUMER
    assert handle.context.trace_id == trace_id
    assert handle.parent.span_id == producer.get_span_context().span_id
    assert handle.attributes == {
        "messaging.system": "django_outbox",
        "messaging.destination.name": "peer",
        "messaging.operation.type": "process",
        "messaging.operation.name": "handle",
        "messaging.message.id": str(sent.message_id),
        "messaging.message.conversation_id": "c-1",
        "django_outbox.message.type": "trace.test",
        "django_outbox.message.key": "k",
        "django_outbox.attempt": 1,
    }
    # The handler's span is current while it runs: its own spans nest under it, and
    # what it sends carries the trace on.
    inside = spans.one("inside the handler")
    assert inside.parent.span_id == handle.context.span_id
    onward = OutboxMessage.objects.get(type="trace.onward")
    carried = tracing.parse_traceparent(onward.headers["traceparent"])
    assert (carried.trace_id, carried.span_id) == (trace_id, inside.context.span_id)


def test_a_failing_handler_s_span_is_an_error_with_the_exception(
    spans, configure_outbox, traced_handler
):
    local_pipeline(configure_outbox)
    with spans.tracer.start_as_current_span("checkout"):
        django_outbox.send("trace.test", {"fail": True}, to="peer")
    Relay().drain()
    Inbox().drain()
    assert InboxMessage.objects.get().state == InboxState.HANDLE_ERROR
    # Run once with the batch, once alone after the batch rolled back: both failed.
    handles = spans.named("handle trace.test")
    assert [span.status.status_code for span in handles] == [StatusCode.ERROR] * 2
    assert handles[-1].status.description == "ValueError: cannot handle this one"
    exception = next(event for event in handles[-1].events if event.name == "exception")
    assert exception.attributes["exception.type"] == "ValueError"


@pytest.mark.jobs
def test_a_job_runs_in_a_child_span_of_the_enqueue_context_failures_recorded(spans):
    from django_outbox.jobs.models import Job
    from django_outbox.jobs.running import Jobs
    from testproject.shop import jobs

    with spans.tracer.start_as_current_span("request") as request:
        with transaction.atomic():
            good = jobs.add.enqueue(2, 3)
            jobs.always_fails.enqueue("no")
    untraced = jobs.noop.enqueue()
    assert Job.objects.get(result_id=good.id).traceparent == traceparent_of(request)
    assert Job.objects.get(result_id=untraced.id).traceparent == ""
    Jobs().drain()
    runs = {span.attributes["django_outbox.task"]: span for span in spans.named_prefix("run ")}
    add = runs["testproject.shop.jobs.add"]
    assert add.name == "run testproject.shop.jobs.add"
    assert add.parent.span_id == request.get_span_context().span_id
    assert add.context.trace_id == request.get_span_context().trace_id
    assert add.attributes["messaging.message.id"] == good.id
    assert add.attributes["messaging.destination.name"] == "default"
    assert add.status.status_code == StatusCode.UNSET
    failed = runs["testproject.shop.jobs.always_fails"]
    assert failed.parent.span_id == request.get_span_context().span_id
    assert failed.status.status_code == StatusCode.ERROR
    assert any(event.name == "exception" for event in failed.events)
    assert runs["testproject.shop.jobs.noop"].parent is None


# -- the consumers ------------------------------------------------------------------------


@pytest.mark.redis
def test_inbox_consume_receives_a_batch_in_one_span_linked_to_each_producer(
    spans, configure_outbox, redis_url, traced_handler
):
    queue = f"trace-{uuid.uuid4().hex[:8]}"
    kombu = {"TRANSPORT": "kombu", "URL": redis_url, "QUEUE": queue}
    configure_outbox(DESTINATIONS={"peer": kombu, **_memory()}, INBOX={"SOURCES": {"peer": kombu}})
    producers = []
    for n in range(2):
        with spans.tracer.start_as_current_span(f"request {n}") as span:
            producers.append(span.get_span_context())
            django_outbox.send("trace.test", {"n": n}, to="peer")
    assert Relay().drain().sent == 2
    call_command("inbox_consume", "peer", "--until-idle", "0.5")
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 2
    receive = spans.one("receive peer")
    assert receive.attributes["messaging.system"] == "redis"
    assert receive.attributes["messaging.batch.message_count"] == 2
    assert {(link.context.trace_id, link.context.span_id) for link in receive.links} == {
        (p.trace_id, p.span_id) for p in producers
    }
    parents = {(s.context.trace_id, s.parent.span_id) for s in spans.named("handle trace.test")}
    assert parents == {(p.trace_id, p.span_id) for p in producers}


WEBHOOK_SECRET = "s3cret"


def post_to_webhook(client, configure_outbox, message_id, unsigned):
    """POST a signed delivery of *message_id* to a ``partner`` webhook source, with the
    *unsigned* headers besides; assert it was answered 200."""
    configure_outbox(
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": WEBHOOK_SECRET}}}
    )
    body = b"{}"
    signed = {"outbox-type": "trace.test", "outbox-message-id": message_id}
    response = client.post(
        reverse("django_outbox:webhook", args=["partner"]),
        data=body,
        content_type="application/json",
        headers={
            "Outbox-Signature": signing.sign(WEBHOOK_SECRET, body, headers=signed),
            **signed,
            **unsigned,
        },
    )
    assert response.status_code == 200, response.content


def test_the_webhook_reads_the_trace_headers_unsigned(spans, client, configure_outbox):
    producer = "00-000000000000000000000000000000aa-00000000000000bb-01"
    unsigned = {
        "traceparent": producer,
        "sentry-trace": "0123456789abcdef0123456789abcdef-0123456789abcdef-1",
        "baggage": "sentry-trace_id=0123456789abcdef0123456789abcdef",
        "x-other": "not part of the envelope",
    }
    post_to_webhook(client, configure_outbox, "m-1", unsigned)
    assert InboxMessage.objects.get().headers == {
        "traceparent": producer,
        "sentry-trace": "0123456789abcdef0123456789abcdef-0123456789abcdef-1",
        "baggage": "sentry-trace_id=0123456789abcdef0123456789abcdef",
    }
    receive = spans.one("receive partner")
    assert receive.attributes["messaging.system"] == "http"
    assert receive.attributes["messaging.message.id"] == "m-1"
    assert f"{receive.parent.span_id:016x}" == producer[36:52]


def test_without_a_tracer_provider_the_webhook_keeps_the_context_current_around_it(
    client, configure_outbox
):
    """No provider: a delivery with no context of its own gets no receive span (it would
    record nothing) and stores the context current around the view, as the span would
    have passed it on; one that carries a context keeps its own."""
    assert not tracing.recording()
    around = SpanContext(
        trace_id=0xCC, span_id=0xDD, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    producer = "00-000000000000000000000000000000aa-00000000000000bb-01"
    for message_id, unsigned in (("m-plain", {}), ("m-carried", {"traceparent": producer})):
        with trace.use_span(NonRecordingSpan(around)):
            post_to_webhook(client, configure_outbox, message_id, unsigned)
    stored = {m.message_id: m.headers["traceparent"] for m in InboxMessage.objects.all()}
    assert stored == {"m-plain": traceparent_of(NonRecordingSpan(around)), "m-carried": producer}


@pytest.mark.rabbitmq
def test_the_trace_headers_travel_through_rabbitmq(spans, configure_outbox, amqp_url, queue_name):
    configure_outbox(
        DESTINATIONS={"peer": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}
    )
    with spans.tracer.start_as_current_span("checkout") as span:
        django_outbox.send("order.paid", {}, to="peer", headers={"baggage": "tenant=acme"})
    assert Relay().drain().sent == 1
    with Connection(amqp_url) as connection:
        queue = connection.SimpleQueue(queue_name)
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    assert message.headers["traceparent"] == traceparent_of(span)
    assert message.headers["baggage"] == "tenant=acme"
    assert json.loads(message.body) == {}


def test_the_http_transport_carries_the_context_to_a_live_webhook(
    spans, configure_outbox, live_server
):
    secret = "s3cret"
    configure_outbox(
        DESTINATIONS={
            "partner": {
                "TRANSPORT": "http",
                "URL": f"{live_server.url}/inbox/partner/",
                "SECRET": secret,
            }
        },
        INBOX={"SOURCES": {"partner": {"TRANSPORT": "webhook", "SECRET": secret}}},
    )
    with spans.tracer.start_as_current_span("checkout") as producer:
        django_outbox.send("payment.captured", {"order": "h1"}, to="partner")
    assert Relay().drain().sent == 1
    stored = InboxMessage.objects.get()
    assert stored.headers["traceparent"] == traceparent_of(producer)
    assert Inbox().drain().done == 1
    context = producer.get_span_context()
    for name in ("publish partner", "receive partner", "handle payment.captured"):
        span = spans.one(name)
        assert (span.context.trace_id, span.parent.span_id) == (context.trace_id, context.span_id)
    assert spans.one("publish partner").attributes["messaging.system"] == "http"
