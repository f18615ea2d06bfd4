"""Inbox handlers of the test project, found by autodiscovery."""

import os

from django_outbox import RetryableError, handler
from testproject.shop import faults
from testproject.shop.models import OrderStatus, Payment


@handler("payment.captured")
def payment_captured(message):
    """Records one Payment per handled message: duplicates would show as extra rows."""
    Payment.objects.create(
        order_ref=message.payload["order"], status="captured", sequence=message.sequence
    )
    if os.environ.get("TESTPROJECT_FREEZE_IN_HANDLER"):  # crash tests: killed in here
        faults.freeze_in_handler_once(os.environ["TESTPROJECT_FREEZE_IN_HANDLER"])
    if message.payload.get("kills_its_worker"):  # a poison message: out of memory, say
        os._exit(70)
    if message.payload.get("fail"):
        raise ValueError(f"cannot capture {message.payload['order']}")
    if message.payload.get("retry"):
        raise RetryableError("payment service busy")


@handler("order.status", ordering="latest")
def order_status(message):
    """Keeps the newest status per order; older events arriving late are skipped."""
    OrderStatus.objects.update_or_create(
        order_ref=message.key,
        defaults={"status": message.payload["status"], "sequence": message.sequence},
    )


@handler("order.step", ordering="strict")
def order_step(message):
    """Appends each step of an order in sequence order: a gap makes later steps wait."""
    Payment.objects.create(order_ref=message.key, status="step", sequence=message.sequence)
    delay = float(os.environ.get("TESTPROJECT_HANDLER_DELAY", "0"))
    if delay:  # contention tests: batches of several workers overlap
        import time

        time.sleep(delay)


@handler("quote.requested")
def quote_requested(message):
    """The responding side of a request: its return value is sent back as the reply."""
    return {"order": message.payload["order"], "price_cents": 4200}


@handler("quote.requested.reply")
def quote_received(message):
    """The requesting side: the reply arrives in its inbox like any message."""
    Payment.objects.create(order_ref=message.payload["order"], status="quoted")


@handler("bench.noop")
def bench_noop(message):
    """The benchmark's handler: nothing to do, so what is measured is the inbox itself."""


@handler("invoice.requested")
def invoice_requested(message):
    """The demo's other side: one invoice (a Payment row) per order, exactly once."""
    Payment.objects.create(order_ref=str(message.payload["order_id"]), status="invoiced")
    delay = float(os.environ.get("TESTPROJECT_HANDLER_DELAY", "0"))
    if delay:  # the demo slows handling so that its kill lands mid-stream
        import time

        time.sleep(delay)


@handler("bench.latency")
def bench_latency(message):
    """The latency benchmark's handler: notes when it ran (microseconds since the epoch)."""
    import time

    Payment.objects.create(
        order_ref=message.message_id, status="latency", sequence=int(time.time() * 1_000_000)
    )


@handler("trace.checked")
def trace_checked(message):
    """The tracing test's handler: a span of its own, which nests under the handler's."""
    from opentelemetry import trace

    with trace.get_tracer("shop").start_as_current_span("shop.trace_checked"):
        Payment.objects.create(order_ref=message.payload["order"], status="traced")


# The chaos harness (tests/chaos): one effect row per handled message, keyed by its id.


@handler("chaos.order")
def chaos_order(message):
    """An effect per message; with ``job`` in the payload B also enqueues a job."""
    Payment.objects.create(order_ref=message.message_id, status="chaos")
    if message.payload.get("job"):
        from testproject.shop.jobs import chaos_run

        chaos_run.enqueue(f"b:{message.message_id}")


@handler("chaos.step", ordering="strict")
def chaos_step(message):
    """A strict key's step: the effect rows' order is the order handled."""
    Payment.objects.create(
        order_ref=message.message_id, status="chaos-strict", sequence=message.sequence
    )


@handler("chaos.status", ordering="latest")
def chaos_status(message):
    """A latest key: stale arrivals are skipped, the newest stays."""
    Payment.objects.create(
        order_ref=message.message_id, status="chaos-latest", sequence=message.sequence
    )
    OrderStatus.objects.update_or_create(
        order_ref=f"chaos:{message.key}",
        defaults={"status": message.payload["status"], "sequence": message.sequence},
    )


@handler("chaos.quote")
def chaos_quote(message):
    """B's side of a request: an effect, and the return value goes back as the reply."""
    Payment.objects.create(order_ref=message.message_id, status="chaos-quote")
    return {"quoted": message.payload["unit"]}


@handler("chaos.quote.reply")
def chaos_quote_reply(message):
    """A's side: the reply's effect, keyed by the request's correlation id."""
    Payment.objects.create(order_ref=message.correlation_id, status="chaos-reply")
