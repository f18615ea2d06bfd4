"""One trace across real processes: a producer sends in a span of its own, a real
``outbox_relay`` publishes to a real RabbitMQ, a real ``inbox_consume`` stores and
handles. Each process records its spans to a file of its own (``testproject.tracing``);
the test reads them back and follows the chain from the producer's span to the handler's
and to the span the handler's own code opened. The same through a real Celery worker,
whose task reads the trace headers besides the outbox's."""

import json
import textwrap

import pytest

import django_outbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay
from testproject.shop.models import Payment
from tests.acceptance.helpers import CeleryWorker, wait_for
from tests.conftest import spawn_manage, subprocess_env
from tests.spans import capture, traceparent_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.row_locks,
    pytest.mark.rabbitmq,
    pytest.mark.processes,
    pytest.mark.one_database,
]

#: The producer: two requests, each a span of its own, each sending one message.
PRODUCER = textwrap.dedent(
    """
    import json
    from django.db import transaction
    from opentelemetry import trace
    import django_outbox

    tracer = trace.get_tracer("shop")
    for order in ("o1", "o2"):
        with tracer.start_as_current_span(f"checkout {order}") as span:
            with transaction.atomic():
                message = django_outbox.send("trace.checked", {"order": order}, to="events")
        print(json.dumps({"order": order, "message_id": str(message.message_id)}))
    """
)


def run(spans_file, *args):
    """``manage.py *args`` in a process of its own recording its spans to *spans_file*."""
    process = spawn_manage(*args, env=subprocess_env(TESTPROJECT_SPANS_FILE=str(spans_file)))
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return output


def read_spans(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def only(spans, name):
    found = [span for span in spans if span["name"] == name]
    assert len(found) == 1, (name, [span["name"] for span in spans])
    return found[0]


def caused_by(span, cause):
    """Whether *span* is a child of *cause* or links to it."""
    ids = (cause["trace_id"], cause["span_id"])
    parent = (span["trace_id"], span["parent_span_id"])
    return parent == ids or ids in {(link["trace_id"], link["span_id"]) for link in span["links"]}


def test_one_trace_from_the_producer_through_the_relay_and_rabbitmq_to_the_handler(
    configure_outbox, amqp_url, queue_name, tmp_path
):
    route = {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}
    configure_outbox(DESTINATIONS={"events": route}, INBOX={"SOURCES": {"events": route}})
    files = {name: tmp_path / f"{name}.jsonl" for name in ("producer", "relay", "consumer")}

    output = run(files["producer"], "shell", "-c", PRODUCER)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    sent = {line["order"]: line["message_id"] for line in lines}
    assert set(sent) == {"o1", "o2"}, output
    run(files["relay"], "outbox_relay", "--until-empty", "--no-listen")
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {OutboxState.SENT}
    run(files["consumer"], "inbox_consume", "events", "--until-idle", "1")
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 2
    assert Payment.objects.filter(status="traced").count() == 2

    producer, relay, consumer = (read_spans(files[n]) for n in ("producer", "relay", "consumer"))
    assert len({span["pid"] for spans in (producer, relay, consumer) for span in spans}) == 3
    publishes = [span for span in relay if span["name"] == "publish events"]
    receives = [span for span in consumer if span["name"] == "receive events"]
    assert publishes and receives
    for order, message_id in sent.items():
        checkout = only(producer, f"checkout {order}")
        # The row carried the producer's context through the relay and the broker.
        publish = next(p for p in publishes if caused_by(p, checkout))
        assert publish["kind"] == "PRODUCER"
        assert publish["attributes"]["messaging.system"] == "rabbitmq"
        assert publish["attributes"]["messaging.destination.name"] == "events"
        assert next(r for r in receives if caused_by(r, checkout))["kind"] == "CONSUMER"
        # The handler's span is a child of the producer's, in its trace …
        handle = next(
            span
            for span in consumer
            if span["name"] == "handle trace.checked"
            and span["attributes"]["messaging.message.id"] == message_id
        )
        assert handle["trace_id"] == checkout["trace_id"]
        assert handle["parent_span_id"] == checkout["span_id"]
        assert handle["attributes"]["messaging.operation.type"] == "process"
        assert handle["status"] == "UNSET"
        # … and the span the handler's code opened is a child of the handler's.
        own = [
            span
            for span in consumer
            if span["name"] == "shop.trace_checked" and span["parent_span_id"] == handle["span_id"]
        ]
        assert len(own) == 1 and own[0]["trace_id"] == checkout["trace_id"]


@pytest.mark.redis
def test_the_trace_headers_survive_the_celery_transport_and_a_real_worker(
    configure_outbox, redis_url, queue_name, tmp_path
):
    """The Celery task reads the trace headers besides the outbox's: the stored message
    keeps them, and the worker's spans join the producer's trace."""
    configure_outbox(
        DESTINATIONS={
            "peer": {"TRANSPORT": "celery", "TASK": "django_outbox.receive", "QUEUE": queue_name}
        },
        INBOX={"SOURCES": {"peer": {"TRANSPORT": "celery", "QUEUE": queue_name}}},
    )
    sentry = {"sentry-trace": f"{'ab' * 16}-{'cd' * 8}-1", "baggage": "sentry-sample_rand=0.5"}
    capturing = capture()
    spans = next(capturing)
    try:
        with spans.tracer.start_as_current_span("checkout") as checkout:
            payload = {"order": "c1"}
            sent = django_outbox.send("trace.checked", payload, to="peer", headers=sentry)
    finally:
        capturing.close()
    assert Relay().drain().sent == 1
    worker_spans = tmp_path / "worker.jsonl"
    worker = CeleryWorker(queue_name, TESTPROJECT_SPANS_FILE=str(worker_spans))
    try:
        wait_for(
            lambda: InboxMessage.objects.filter(state=InboxState.HANDLED).exists(),
            timeout=60,
            what="the worker to store and handle the message",
        )
    finally:
        worker.stop()
    stored = InboxMessage.objects.get()
    assert stored.headers == {"traceparent": traceparent_of(checkout), **sentry}
    context = checkout.get_span_context()
    spans_of_worker = read_spans(worker_spans)
    handle = only(spans_of_worker, "handle trace.checked")
    assert handle["attributes"]["messaging.message.id"] == str(sent.message_id)
    assert handle["attributes"]["messaging.system"] == "celery"
    assert (handle["trace_id"], handle["parent_span_id"]) == (
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    receive = only(spans_of_worker, "receive peer")
    assert receive["parent_span_id"] == f"{context.span_id:016x}"
