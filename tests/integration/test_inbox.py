"""The inbox: idempotent receive, handling in one transaction with its effects,
failures recorded with their traceback, ordering per key."""

import random
import uuid

import pytest
from django.db import transaction

import django_outbox
from django_outbox import InvalidMessage, PayloadError
from django_outbox.inbox.handlers import get_handler, handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxCursor, InboxMessage, InboxState
from django_outbox.signals import inbox_message_failed
from testproject.shop.models import OrderStatus, Payment
from tests.conftest import row_held_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)


def receive(type_, payload, **kwargs):
    kwargs.setdefault("source", "payments")
    kwargs.setdefault("message_id", str(uuid.uuid4()))
    return django_outbox.receive(type_, payload, **kwargs)


def test_handlers_are_found_by_autodiscovery():
    assert get_handler("payment.captured").name == "testproject.shop.handlers.payment_captured"
    assert get_handler("order.status").ordering == "latest"


def test_a_duplicate_is_stored_once_and_returns_the_stored_row():
    first, created = receive("payment.captured", {"order": "o1"}, message_id="m-1")
    again, created_again = receive("payment.captured", {"order": "changed"}, message_id="m-1")
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk and again.payload == {"order": "o1"}
    # The same id from another source is another message.
    _, other = receive("payment.captured", {"order": "o1"}, message_id="m-1", source="billing")
    assert other and InboxMessage.objects.count() == 2


def test_a_duplicate_inside_a_transaction_leaves_it_usable():
    receive("payment.captured", {"order": "o1"}, message_id="m-1")
    with transaction.atomic():
        _, created = receive("payment.captured", {"order": "o1"}, message_id="m-1")
        Payment.objects.create(order_ref="after", status="x")
    assert not created and Payment.objects.filter(order_ref="after").exists()


def test_handling_commits_the_effect_and_the_handled_mark_together():
    message, _ = receive("payment.captured", {"order": "o1"})
    result = Inbox().drain()
    assert (result.claimed, result.done) == (1, 1)
    message.refresh_from_db()
    assert message.state == InboxState.HANDLED and message.handled_at is not None
    assert message.attempts == 1
    assert Payment.objects.filter(order_ref="o1").count() == 1
    # Handled once: another drain finds nothing and adds no effect.
    assert Inbox().drain().claimed == 0
    assert Payment.objects.count() == 1


def test_a_failing_handler_rolls_back_its_own_effects_only_and_keeps_the_traceback():
    failed = []
    inbox_message_failed.connect(lambda **kw: failed.append(kw), weak=False)
    try:
        receive("payment.captured", {"order": "good"})
        bad, _ = receive("payment.captured", {"order": "bad", "fail": True})
        result = Inbox().drain()
    finally:
        inbox_message_failed.receivers.clear()
    assert (result.done, result.failed) == (1, 1)
    bad.refresh_from_db()
    assert bad.state == InboxState.HANDLE_ERROR
    assert bad.last_error == "ValueError: cannot capture bad"
    assert "Traceback (most recent call last)" in bad.traceback
    assert "payment_captured" in bad.traceback
    # The failed handler's Payment row was rolled back with its savepoint.
    assert list(Payment.objects.values_list("order_ref", flat=True)) == ["good"]
    assert [f["will_retry"] for f in failed] == [False]


def test_retryable_errors_back_off_then_give_up(configure_outbox):
    configure_outbox(INBOX={"MAX_ATTEMPTS": 2, "RETRY_BASE_SECONDS": 0})
    message, _ = receive("payment.captured", {"order": "o1", "retry": True})
    assert Inbox().drain().retried == 1
    message.refresh_from_db()
    assert (message.state, message.attempts) == (InboxState.SHOULD_BE_HANDLED, 1)
    assert message.last_error == "RetryableError: payment service busy"
    Inbox().drain()
    message.refresh_from_db()
    assert message.state == InboxState.HANDLE_ERROR
    assert message.last_error.startswith("gave up after 2 attempts")
    assert Payment.objects.count() == 0


def test_retry_on_names_the_exceptions_that_retry():
    @handler("flaky.thing", retry_on=(ConnectionError,))
    def flaky(message):
        raise ConnectionError("refused")

    try:
        message, _ = receive("flaky.thing", {})
        assert Inbox().drain().retried == 1
        message.refresh_from_db()
        assert message.state == InboxState.SHOULD_BE_HANDLED
    finally:
        unregister("flaky.thing")


def test_a_type_without_handler_is_kept_as_an_error_and_handled_after_requeue():
    message, _ = receive("refund.issued", {"order": "o1"})
    Inbox().drain()
    message.refresh_from_db()
    assert message.state == InboxState.HANDLE_ERROR
    assert message.last_error.startswith("no handler for type 'refund.issued'")

    @handler("refund.issued")
    def refund(message):
        Payment.objects.create(order_ref=message.payload["order"], status="refunded")

    try:
        assert message.requeue()
        assert Inbox().drain().done == 1
        message.refresh_from_db()
        assert message.state == InboxState.HANDLED
    finally:
        unregister("refund.issued")


def test_a_handler_can_send_in_the_same_transaction(configure_outbox):
    from django_outbox.models import OutboxMessage

    @handler("order.placed")
    def placed(message):
        django_outbox.send("invoice.requested", {"order": message.payload["order"]})
        if message.payload.get("fail"):
            raise ValueError("no")

    try:
        receive("order.placed", {"order": "o1"})
        receive("order.placed", {"order": "o2", "fail": True})
        Inbox().drain()
    finally:
        unregister("order.placed")
    # Consume and produce as one step: the failed handler's send was rolled back.
    assert [m.payload["order"] for m in OutboxMessage.objects.all()] == ["o1"]


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"type_": ""}, InvalidMessage, "type must be"),
        ({"source": ""}, InvalidMessage, "source must be"),
        ({"message_id": ""}, InvalidMessage, "message_id must be"),
        ({"sequence": 3}, InvalidMessage, "a sequence needs a key"),
        ({"key": "k", "sequence": -1}, InvalidMessage, "non-negative"),
        ({"payload": {"x": object()}}, PayloadError, "not JSON-serializable"),
        ({"headers": {"a": 1}}, PayloadError, "must be strings"),
    ],
)
def test_bad_arguments_raise_a_clear_error_and_store_nothing(kwargs, error, fragment):
    type_ = kwargs.pop("type_", "payment.captured")
    payload = kwargs.pop("payload", {})
    with pytest.raises(error, match=fragment):
        receive(type_, payload, **kwargs)
    assert not InboxMessage.objects.exists()


def events(objects=50, per_object=20, seed=7):
    """1,000 status events about 50 objects, shuffled, a third of them sent twice."""
    rng = random.Random(seed)
    items = [
        (f"order:{o}", n, f"{o}-{n}") for o in range(objects) for n in range(1, per_object + 1)
    ]
    items += rng.sample(items, len(items) // 3)
    rng.shuffle(items)
    return items


def test_latest_ends_every_object_in_its_newest_state(configure_outbox):
    configure_outbox(INBOX={"BATCH_SIZE": 37})
    batches = events()
    for start in range(0, len(batches), 100):
        for key, n, message_id in batches[start : start + 100]:
            receive("order.status", {"status": f"s{n}"}, key=key, sequence=n, message_id=message_id)
        Inbox().drain()
    assert InboxMessage.objects.count() == 1000
    states = dict(OrderStatus.objects.values_list("order_ref", "sequence"))
    assert states == {f"order:{o}": 20 for o in range(50)}
    assert set(OrderStatus.objects.values_list("status", flat=True)) == {"s20"}
    assert InboxMessage.objects.filter(state=InboxState.SHOULD_BE_HANDLED).count() == 0
    skipped = InboxMessage.objects.filter(state=InboxState.SKIPPED)
    assert skipped.exists() and "not newer than" in skipped.first().last_error
    assert set(InboxCursor.objects.values_list("last_sequence", flat=True)) == {20}


def test_strict_handles_each_objects_events_in_sequence_order(configure_outbox):
    configure_outbox(INBOX={"BATCH_SIZE": 37})
    batches = events()
    for start in range(0, len(batches), 100):
        for key, n, message_id in batches[start : start + 100]:
            receive("order.step", {}, key=key, sequence=n, message_id=message_id)
        Inbox().drain()
    # What waited for a gap was woken by its predecessor: nothing is left waiting.
    assert InboxMessage.objects.filter(state=InboxState.HANDLED).count() == 1000
    for o in range(50):
        steps = list(
            Payment.objects.filter(order_ref=f"order:{o}")
            .order_by("pk")
            .values_list("sequence", flat=True)
        )
        assert steps == list(range(1, 21))


def test_strict_waits_for_a_gap_and_says_so():
    receive("order.step", {}, key="order:1", sequence=1)
    later, _ = receive("order.step", {}, key="order:1", sequence=3)
    result = Inbox().drain()
    assert (result.done, result.deferred) == (1, 1)
    later.refresh_from_db()
    assert later.state == InboxState.SHOULD_BE_HANDLED
    assert later.attempts == 0
    assert later.last_error == "waiting for sequence 2 of key 'order:1' (this is 3)"
    receive("order.step", {}, key="order:1", sequence=2)
    Inbox().drain()
    later.refresh_from_db()
    assert later.state == InboxState.HANDLED
    steps = Payment.objects.order_by("pk").values_list("sequence", flat=True)
    assert list(steps) == [1, 2, 3]


def test_a_waiting_successor_another_transaction_holds_is_woken_once_it_lets_go():
    """Handling sequence 1 wakes sequence 2, which waits for its gap; but another
    transaction holds its row just then (on InnoDB a claim that scans the table locks
    each row it reads). The wake-up must not be lost: it is made once the batch has
    committed, waiting for the holder, instead of leaving sequence 2 to its gap
    alert (five minutes)."""
    later, _ = receive("order.step", {}, key="order:7", sequence=2)
    assert Inbox().drain().deferred == 1
    receive("order.step", {}, key="order:7", sequence=1)
    with row_held_elsewhere(InboxMessage.objects.filter(pk=later.pk)):
        result = Inbox().drain()
    later.refresh_from_db()
    assert later.state == InboxState.HANDLED, later.last_error
    assert result.done == 2
    steps = Payment.objects.filter(order_ref="order:7").order_by("pk")
    assert list(steps.values_list("sequence", flat=True)) == [1, 2]


def test_a_gap_older_than_the_alert_time_is_reported_once(configure_outbox, caplog):
    from django_outbox.signals import inbox_gap_detected

    configure_outbox(INBOX={"GAP_ALERT_SECONDS": 0})
    alerts = []
    inbox_gap_detected.connect(lambda **kw: alerts.append(kw["missing"]), weak=False)
    try:
        later, _ = receive("order.step", {}, key="order:9", sequence=2)
        Inbox().drain()
        Inbox().drain()
    finally:
        inbox_gap_detected.receivers.clear()
    later.refresh_from_db()
    assert later.state == InboxState.SHOULD_BE_HANDLED
    assert later.last_error.startswith("gap alert: waiting for sequence 1 of key 'order:9'")
    assert alerts == [1]
    assert caplog.text.count("inbox gap: message") == 1


def test_the_local_transport_delivers_into_our_own_inbox_once(configure_outbox):
    from django_outbox.models import OutboxMessage, OutboxState
    from django_outbox.outbox.relay import Relay

    configure_outbox(DESTINATIONS={"self": {"TRANSPORT": "local", "SOURCE": "self"}})
    sent = django_outbox.send("payment.captured", {"order": "o1"}, to="self", key="order:1")
    assert Relay().drain().sent == 1
    OutboxMessage.objects.update(state=OutboxState.SHOULD_BE_SENT)  # delivered again
    assert Relay().drain().sent == 1
    [stored] = InboxMessage.objects.all()
    assert (stored.source, stored.message_id) == ("self", str(sent.message_id))
    assert (stored.key, stored.sequence, stored.payload) == ("order:1", 1, {"order": "o1"})
    assert Inbox().drain().done == 1
    assert Payment.objects.count() == 1


def test_an_idempotent_task_runs_once_per_task_id():
    from testproject.shop.tasks import capture_payment

    first = capture_payment.apply(args=("o1",), task_id="task-1")
    again = capture_payment.apply(args=("o1",), task_id="task-1")  # a redelivery
    assert (first.result, again.result) == ("o1", None)
    assert Payment.objects.filter(status="task").count() == 1
    record = InboxMessage.objects.get(source="celery-task", message_id="task-1")
    assert (record.type, record.state) == ("shop.capture_payment", InboxState.HANDLED)
    assert record.payload == {"args": ["o1"], "kwargs": {}}


def test_a_failed_idempotent_task_leaves_no_record_and_runs_again():
    from testproject.shop.tasks import capture_payment

    failed = capture_payment.apply(args=("o2",), kwargs={"fail": True}, task_id="task-2")
    assert failed.failed()
    assert not InboxMessage.objects.filter(message_id="task-2").exists()
    assert not Payment.objects.exists()  # rolled back with the record
    assert capture_payment.apply(args=("o2",), task_id="task-2").result == "o2"
    assert Payment.objects.count() == 1


def test_inbox_requeue_by_type_with_a_dry_run_first():
    import io

    from django.core.management import CommandError, call_command

    for n in range(3):
        receive("refund.issued", {"n": n})
    receive("payment.captured", {"order": "bad", "fail": True})
    Inbox().drain()
    assert InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).count() == 4
    out = io.StringIO()
    call_command("inbox_requeue", "--type", "refund.issued", "--dry-run", stdout=out)
    assert out.getvalue().strip() == "3 message(s) would be requeued (dry run)"
    assert InboxMessage.objects.filter(state=InboxState.HANDLE_ERROR).count() == 4
    out = io.StringIO()
    call_command("inbox_requeue", "--type", "refund.issued", "--batch", "2", stdout=out)
    assert out.getvalue().splitlines() == ["requeued 2/3", "requeued 3/3", "requeued 3 message(s)"]
    assert InboxMessage.objects.filter(state=InboxState.SHOULD_BE_HANDLED).count() == 3
    with pytest.raises(CommandError, match="at least one of"):
        call_command("inbox_requeue")
    # --id takes the sender's message id or the row id.
    InboxMessage.objects.update(state=InboxState.HANDLE_ERROR)
    by_sender, by_row, _left = InboxMessage.objects.order_by("pk")[:3]
    out = io.StringIO()
    call_command("inbox_requeue", "--id", by_sender.message_id, "--id", str(by_row.pk), stdout=out)
    assert out.getvalue().strip() == "requeued 2 message(s)"
    assert set(
        InboxMessage.objects.filter(state=InboxState.SHOULD_BE_HANDLED).values_list("pk", flat=True)
    ) == {by_sender.pk, by_row.pk}


def test_request_and_reply_are_matched_by_correlation_id(configure_outbox):
    """Two services over local transports (A's outbox to B's inbox and back)."""
    from django_outbox.models import OutboxMessage
    from django_outbox.outbox.relay import Relay

    configure_outbox(
        DESTINATIONS={
            "to-b": {"TRANSPORT": "local", "SOURCE": "from-a"},
            "to-a": {"TRANSPORT": "local", "SOURCE": "from-b"},
        },
        INBOX={
            "SOURCES": {
                "from-a": {"TRANSPORT": "local", "REPLY_TO": "to-a"},
                "from-b": {"TRANSPORT": "local"},
            }
        },
    )
    request = django_outbox.send("quote.requested", {"order": "o9"}, to="to-b", reply_to="from-b")
    assert request.correlation_id == str(request.message_id)
    assert request.headers["outbox-reply-to"] == "from-b"
    Relay().drain()  # A → B
    Inbox().drain()  # B handles, its reply goes into its outbox in the same transaction
    [reply_out] = OutboxMessage.objects.filter(type="quote.requested.reply")
    assert reply_out.correlation_id == request.correlation_id
    Relay().drain()  # B → A
    Inbox().drain()  # A handles the reply
    reply_in = InboxMessage.objects.get(source="from-b")
    assert (reply_in.correlation_id, reply_in.state) == (request.correlation_id, InboxState.HANDLED)
    assert reply_in.payload == {"order": "o9", "price_cents": 4200}
    assert Payment.objects.get().status == "quoted"


def test_a_reply_without_a_reply_destination_is_a_clear_handling_error(configure_outbox):
    configure_outbox(INBOX={"SOURCES": {"partner": {"TRANSPORT": "local"}}})
    message, _ = receive(
        "quote.requested",
        {"order": "o1"},
        source="partner",
        headers={"outbox-reply-to": "them"},
        correlation_id="c-1",
    )
    Inbox().drain()
    message.refresh_from_db()
    assert message.state == InboxState.HANDLE_ERROR
    assert "source 'partner' has no REPLY_TO destination" in message.last_error


def test_the_admin_shows_the_request_on_the_reply_and_the_reply_on_the_request(
    configure_outbox, client
):
    from django.contrib.auth.models import User
    from django.urls import reverse

    test_request_and_reply_are_matched_by_correlation_id(configure_outbox)
    from django_outbox.models import OutboxMessage

    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    request = OutboxMessage.objects.get(type="quote.requested")
    reply = InboxMessage.objects.get(source="from-b")
    page = client.get(reverse("admin:django_outbox_outboxmessage_change", args=[request.pk]))
    assert f"quote.requested.reply [handled] (inbox #{reply.pk})" in page.text
    page = client.get(reverse("admin:django_outbox_inboxmessage_change", args=[reply.pk]))
    assert f"quote.requested (outbox #{request.pk})" in page.text


def test_receive_many_returns_the_new_rows_as_stored():
    """The batch insert of inbox_consume (unnest on PostgreSQL, multi-row elsewhere):
    new rows come back as stored, duplicates (earlier or within the batch) do not."""
    from django_outbox.inbox.api import prepare, receive_many

    django_outbox.receive("payment.captured", {"n": 0}, source="shop", message_id="m-0")
    prepared = [
        prepare(
            "payment.captured",
            {"n": n, "amount": "1.50", "nested": [1, {"a": None}]},
            source="shop",
            message_id=f"m-{n % 4}",
            key=f"k{n % 4}" if n % 2 else None,
            sequence=n if n % 2 else None,
            headers={"x-n": str(n)},
            correlation_id=f"c{n}" if n == 3 else None,
        )
        for n in range(8)
    ]
    new, duplicates = receive_many(prepared)
    assert [m.message_id for m in new] == ["m-1", "m-2", "m-3"]
    assert duplicates == 5
    for message in new:
        stored = InboxMessage.objects.get(pk=message.pk)
        for field in ("source", "message_id", "type", "payload", "headers", "key", "sequence"):
            assert getattr(message, field) == getattr(stored, field), field
        assert message.correlation_id == stored.correlation_id
        assert message.created_at == stored.created_at
        assert message.state == stored.state == InboxState.SHOULD_BE_HANDLED
    assert new[2].payload == {"n": 3, "amount": "1.50", "nested": [1, {"a": None}]}
    assert new[2].correlation_id == "c3"
    assert InboxMessage.objects.count() == 4


def test_a_handler_error_with_a_nul_is_recorded_escaped():
    """PostgreSQL cannot store a NUL: recording the failure must not fail the batch."""

    @handler("binary.thing")
    def binary(message):
        raise ValueError("device answered b'\x00\x01'")

    try:
        message, _ = receive("binary.thing", {})
        assert Inbox().drain().failed == 1
        message.refresh_from_db()
        assert message.state == InboxState.HANDLE_ERROR
        assert message.last_error == "ValueError: device answered b'\\x00\x01'"
        assert "\x00" not in message.traceback and "\\x00" in message.traceback
    finally:
        unregister("binary.thing")


def test_one_drain_handles_every_message_a_killed_worker_left_behind():
    """Messages whose worker died mid-batch (their attempt open) are each claimed alone,
    and the drain goes on after each: recovery takes one drain, not one sweep per
    message (the demo waited 10 s per message)."""
    left = [receive("payment.captured", {"order": f"o{n}"})[0] for n in range(5)]
    InboxMessage.objects.filter(pk__in=[m.pk for m in left]).update(attempt_open=True, attempts=1)
    fresh = [receive("payment.captured", {"order": f"p{n}"})[0] for n in range(3)]
    result = Inbox().drain()
    assert result.done == len(left) + len(fresh)
    states = set(InboxMessage.objects.values_list("state", flat=True))
    assert states == {InboxState.HANDLED}
    assert Payment.objects.count() == len(left) + len(fresh)


def _listener():
    import psycopg
    from django.db import connection

    info = connection.settings_dict
    listener = psycopg.connect(
        host=info["HOST"] or "127.0.0.1",
        port=info["PORT"] or 5432,
        dbname=info["NAME"],
        user=info["USER"] or "postgres",
        autocommit=True,
    )
    listener.execute('LISTEN "django_outbox"')
    return listener


@pytest.mark.postgres
def test_notify_mode_queues_the_notification_in_the_insert_itself(
    configure_outbox, django_assert_num_queries
):
    """As send() does: the INSERT of a new message queues the NOTIFY, delivered at
    commit, once; no statement after the commit."""
    configure_outbox(DISPATCH="notify")
    listener = _listener()
    try:
        # BEGIN, one INSERT per receive(), COMMIT: no statement on commit.
        with django_assert_num_queries(4), transaction.atomic():
            receive("payment.captured", {"order": "n1"}, message_id="n-1")
            receive("payment.captured", {"order": "n2"}, message_id="n-2")
            assert not list(listener.notifies(timeout=0.2, stop_after=1))  # not before commit
        [notification] = list(listener.notifies(timeout=2, stop_after=1))
        assert (notification.channel, notification.payload) == ("django_outbox", "inbox")
    finally:
        listener.close()


@pytest.mark.postgres
def test_notify_mode_tells_nothing_of_a_duplicate_or_a_rollback(configure_outbox):
    configure_outbox(DISPATCH="notify")
    receive("payment.captured", {"order": "d1"}, message_id="d-1")
    listener = _listener()
    try:
        receive("payment.captured", {"order": "d1"}, message_id="d-1")  # a duplicate
        with pytest.raises(RuntimeError), transaction.atomic():
            receive("payment.captured", {"order": "d2"}, message_id="d-2")
            raise RuntimeError("rolled back")
        assert not list(listener.notifies(timeout=0.5, stop_after=1))
        assert not InboxMessage.objects.filter(message_id="d-2").exists()
    finally:
        listener.close()


def test_receive_prepared_stores_once_and_triggers_the_new_message_only(
    configure_outbox, monkeypatch
):
    """The webhook view's store: as receive() for the row and its trigger, and it says
    only whether the message was new."""
    from django_outbox.engine import triggers
    from django_outbox.inbox.api import prepare, receive_prepared

    configure_outbox(DISPATCH="celery")
    scheduled = []
    monkeypatch.setattr(triggers, "schedule", lambda part, using, pk: scheduled.append((part, pk)))
    prepared = prepare(
        "payment.captured",
        {"order": "p1", "amount": "1.50"},
        source="shop",
        message_id="p-1",
        key="order-p1",
        sequence=3,
        headers={"x-n": "1"},
    )
    assert receive_prepared(prepared) is True
    assert receive_prepared(prepared) is False
    stored = InboxMessage.objects.get(source="shop", message_id="p-1")
    assert (stored.type, stored.payload, stored.key, stored.sequence, stored.headers) == (
        "payment.captured",
        {"order": "p1", "amount": "1.50"},
        "order-p1",
        3,
        {"x-n": "1"},
    )
    assert stored.state == InboxState.SHOULD_BE_HANDLED
    assert scheduled == [("inbox", stored.pk)]


def test_rows_handled_in_their_own_transaction_record_each_its_own_attempts():
    """``run_owned`` (``inbox_consume``'s path): rows that finish together share one
    UPDATE only where they share its values; a row's attempt count is its own."""

    @handler("owned.thing")
    def owned(message):
        Payment.objects.create(order_ref=message.message_id, status="seen")

    try:
        with transaction.atomic():
            first, _ = receive("owned.thing", {}, message_id="m-1")
            second, _ = receive("owned.thing", {}, message_id="m-2")
            third, _ = receive("owned.thing", {}, message_id="m-3")
            InboxMessage.objects.filter(pk=second.pk).update(attempts=2)
            second.attempts = 2
            assert Inbox().run_owned([first, second, third]).done == 3
        recorded = dict(InboxMessage.objects.values_list("message_id", "attempts"))
        assert recorded == {"m-1": 1, "m-2": 3, "m-3": 1}
        assert set(InboxMessage.objects.values_list("state", flat=True)) == {InboxState.HANDLED}
        assert Payment.objects.filter(status="seen").count() == 3
    finally:
        unregister("owned.thing")
