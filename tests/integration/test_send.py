"""send(): one INSERT in the caller's transaction, one dispatch per transaction."""

import decimal
import math
import threading
import time

import pytest
from django.db import transaction

import django_outbox
from django_outbox.engine import triggers as dispatch
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.tasks import deliver_messages
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db


class Published(list):
    """Ids of each deliver task published; reading it waits for the dispatcher thread."""

    def __eq__(self, other):
        assert dispatch.flush(timeout=5)
        return list(self) == other

    __hash__ = None


@pytest.fixture
def dispatched(configure_outbox, monkeypatch):
    """Celery dispatch on; records the ids of each deliver task instead of publishing."""
    configure_outbox(DISPATCH="celery")
    # What earlier tests left for the dispatcher thread goes out first, not into ours.
    assert dispatch.flush(timeout=30)
    calls = Published()
    monkeypatch.setattr(
        deliver_messages, "apply_async", lambda args, **kw: calls.append(sorted(args[0]))
    )
    return calls


def test_commit_stores_the_message_and_dispatches_once_with_all_ids(
    dispatched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        first = django_outbox.send("order.created", {"id": 1})
        second = django_outbox.send("order.paid", {"id": 1}, headers={"tenant": "acme"})
    assert dispatched == [sorted([first.pk, second.pk])]
    stored = OutboxMessage.objects.get(pk=second.pk)
    assert stored.state == OutboxState.SHOULD_BE_SENT
    assert stored.payload == {"id": 1}
    assert stored.headers == {"tenant": "acme"}
    assert stored.attempts == 0


def test_without_dispatch_a_commit_runs_no_callback_of_ours(
    configure_outbox, django_capture_on_commit_callbacks
):
    # DISPATCH = "none": the relay polls and the sweeps run the rows; nothing to wake.
    configure_outbox(DISPATCH="none")
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        message = django_outbox.send("order.created", {"id": 1})
    assert not [c for c in callbacks if isinstance(c, dispatch.Trigger)]
    assert OutboxMessage.objects.get(pk=message.pk).state == OutboxState.SHOULD_BE_SENT


def test_rollback_leaves_no_row_and_dispatches_nothing(
    dispatched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            django_outbox.send("order.created", {"id": 1})
            raise RuntimeError("business failure")
    assert not OutboxMessage.objects.exists()
    assert dispatched == []


def test_rolled_back_savepoint_does_not_lose_the_outer_dispatch(
    dispatched, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            django_outbox.send("inner", {})
            raise RuntimeError
        outer = django_outbox.send("outer", {})
    assert list(OutboxMessage.objects.values_list("type", flat=True)) == ["outer"]
    assert dispatch.flush()
    assert len(dispatched) == 1
    assert outer.pk in dispatched[0]


@pytest.mark.django_db(transaction=True)
def test_autocommit_send_dispatches_immediately(dispatched):
    message = django_outbox.send("order.created", {"id": 2})
    assert dispatched == [[message.pk]]


def test_commit_does_not_wait_for_the_broker_and_busy_triggers_merge(
    configure_outbox, monkeypatch, django_capture_on_commit_callbacks
):
    configure_outbox(DISPATCH="celery")
    gate = threading.Event()
    published = []

    def slow_broker(args, **kwargs):
        published.append((threading.current_thread().name, sorted(args[0])))
        gate.wait(5)

    monkeypatch.setattr(deliver_messages, "apply_async", slow_broker)
    ids = []
    for n in range(3):
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            ids.append(django_outbox.send("t", {"n": n}).pk)
    # All three commits returned while the broker was stuck on the first trigger.
    assert not gate.is_set()
    gate.set()
    assert dispatch.flush()
    assert {name for name, _ in published} == {"django-outbox-dispatch"}
    assert [i for _, chunk in published for i in chunk] == ids
    assert len(published) <= 2  # the commits made while it was busy went out as one


def test_dispatch_in_the_committing_thread_when_background_is_off(configure_outbox, monkeypatch):
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)
    threads = []
    monkeypatch.setattr(
        deliver_messages,
        "apply_async",
        lambda args, **kw: threads.append(threading.current_thread()),
    )
    dispatch.dispatch("outbox", "default", [1])
    assert threads == [threading.current_thread()]


def test_a_broker_failure_at_dispatch_is_logged_not_raised(configure_outbox, monkeypatch, caplog):
    configure_outbox(DISPATCH="celery", DISPATCH_IN_BACKGROUND=False)

    def broken(*args, **kwargs):
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(deliver_messages, "apply_async", broken)
    dispatch.dispatch("outbox", "default", [1, 2])
    assert "could not dispatch 2 outbox row(s)" in caplog.text
    assert "the sweep will run them" in caplog.text


def test_send_is_one_insert_in_the_callers_transaction(django_assert_num_queries):
    from django.db import connection

    # The per-key counter is one UPSERT … RETURNING; MySQL has no RETURNING.
    counter_queries = 2 if connection.vendor == "mysql" else 1
    with transaction.atomic():
        with django_assert_num_queries(1):
            django_outbox.send("order.created", {"id": 1})
        with django_assert_num_queries(1 + counter_queries):
            django_outbox.send("order.created", {"id": 1}, key="order:1")


def test_same_key_gets_increasing_sequences_per_destination():
    sequences = [django_outbox.send("t", {}, key="k").sequence for _ in range(3)]
    other_key = django_outbox.send("t", {}, key="other").sequence
    other_destination = django_outbox.send("t", {}, key="k", to="held").sequence
    assert sequences == [1, 2, 3]
    assert other_key == 1
    assert other_destination == 1


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"when": object()}, "not JSON-serializable"),
        ({"x": math.nan}, "not JSON-serializable"),
        ({1, 2}, "not JSON-serializable"),
    ],
)
def test_non_json_payload_is_refused_and_the_transaction_stays_usable(payload, error):
    with transaction.atomic():
        with pytest.raises(django_outbox.PayloadError, match=error):
            django_outbox.send("order.created", payload)
        Order.objects.create(customer="c", total_cents=1)
    assert Order.objects.count() == 1
    assert not OutboxMessage.objects.exists()


def test_json_friendly_values_are_accepted():
    message = django_outbox.send("t", {"amount": decimal.Decimal("1.50")})
    message.refresh_from_db()
    assert message.payload == {"amount": "1.50"}


def test_oversize_payload_is_refused(configure_outbox):
    configure_outbox(MAX_PAYLOAD_BYTES=100)
    with transaction.atomic():
        with pytest.raises(django_outbox.PayloadTooLarge, match="MAX_PAYLOAD_BYTES is 100"):
            django_outbox.send("t", {"blob": "x" * 200})
        django_outbox.send("t", {"blob": "small"})
    assert OutboxMessage.objects.count() == 1


def test_unknown_destination_is_refused():
    with transaction.atomic():
        with pytest.raises(django_outbox.UnknownDestination, match="'nowhere'"):
            django_outbox.send("t", {}, to="nowhere")
        Order.objects.create(customer="c", total_cents=1)
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"type": ""}, ValueError, "type must be a non-empty string"),
        ({"type": "t" * 256}, ValueError, "limit is 255"),
        ({"key": 5}, ValueError, "key must be a non-empty string"),
        ({"headers": {"a": 1}}, django_outbox.PayloadError, "header names and values"),
        ({"headers": ["a"]}, django_outbox.PayloadError, "headers must be a mapping"),
    ],
)
def test_bad_arguments_get_clear_errors(kwargs, error, match):
    arguments = {"type": "t", "payload": {}, **kwargs}
    with pytest.raises(error, match=match):
        django_outbox.send(arguments.pop("type"), arguments.pop("payload"), **arguments)
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (None, "is None"),
        ({"note": "a\x00b"}, "NUL character"),
        ({"name": "\ud800"}, "not JSON-serializable"),
    ],
    ids=["none", "nul", "lone-surrogate"],
)
def test_payloads_no_database_can_store_are_refused_up_front(payload, match):
    with transaction.atomic():
        with pytest.raises(django_outbox.PayloadError, match=match):
            django_outbox.send("t", payload)
        Order.objects.create(customer="c", total_cents=1)  # the transaction is intact
    assert Order.objects.count() == 1
    assert not OutboxMessage.objects.exists()


def test_a_literal_backslash_u0000_text_is_fine():
    message = django_outbox.send("t", {"note": "\\u0000 is how JSON writes NUL"})
    message.refresh_from_db()
    assert message.payload == {"note": "\\u0000 is how JSON writes NUL"}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": "order:1\r\nX-Injected: 1"}, ValueError),
        ({"type": "order\ncreated"}, ValueError),
        ({"headers": {"tenant": "acme\r\nX: 1"}}, django_outbox.PayloadError),
        ({"headers": {"bad\nname": "v"}}, django_outbox.PayloadError),
    ],
)
def test_control_characters_in_header_bound_fields_are_refused(kwargs, error):
    arguments = {"type": "t", **kwargs}
    with pytest.raises(error, match="control characters"):
        django_outbox.send(arguments.pop("type"), {}, **arguments)


def test_size_limit_counts_utf8_bytes_not_escapes(configure_outbox):
    configure_outbox(MAX_PAYLOAD_BYTES=40)
    django_outbox.send("t", {"city": "Zürich-Zürich-Zürich"})  # 33 bytes, 51 if \\u-escaped


def test_keys_that_differ_only_in_case_or_trailing_space_are_different_keys():
    sequences = [
        django_outbox.send("t", {}, key=key).sequence for key in ("Order:1", "order:1", "order:1 ")
    ]
    assert sequences == [1, 1, 1]


# Forking a process with threads is the very case under test (Celery's prefork
# pool does it): Python 3.12's warning about it is expected here.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_with_a_fresh_dispatcher(configure_outbox):
    import os

    configure_outbox(DISPATCH="celery")
    background = dispatch._background
    background._lock.acquire()  # the parent forks while its dispatcher holds the lock
    try:
        pid = os.fork()
        if pid == 0:  # the child: must not deadlock, must own a new lock
            code = 0 if background._lock.acquire(timeout=2) and not background._pending else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        background._lock.release()
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    "call",
    [
        {"type": ""},
        {"type": "t", "key": 5},
        {"type": "order\ncreated"},
        {"type": "t", "payload": None},
        {"type": "t", "payload": {"x": object()}},
        {"type": "t", "headers": {"a": 1}},
    ],
)
def test_every_refusal_of_send_is_one_family_of_errors(call):
    arguments = {"payload": {}, **call}
    with pytest.raises(django_outbox.InvalidMessage):
        django_outbox.send(arguments.pop("type"), arguments.pop("payload"), **arguments)


def test_the_returned_message_holds_the_payload_as_it_will_be_published():
    import datetime

    when = datetime.datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    message = django_outbox.send("t", {"amount": decimal.Decimal("1.50"), "at": when, 7: "x"})
    assert message.payload == {"amount": "1.50", "at": "2026-11-23T12:00:00.123Z", "7": "x"}
    message.refresh_from_db()
    assert message.payload == {"amount": "1.50", "at": "2026-11-23T12:00:00.123Z", "7": "x"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_keyed_send_racing_under_repeatable_read_raises_a_clear_error():
    from django.db import connections

    django_outbox.send("t", {}, key="k")  # the counter row exists
    outcome = {}

    def repeatable_read_sender(snapshot_taken, other_committed):
        try:
            with transaction.atomic():
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cursor.execute("SELECT 1")  # the snapshot is taken here
                snapshot_taken.set()
                other_committed.wait(5)
                django_outbox.send("t", {}, key="k")
        except Exception as exc:
            outcome["error"] = exc
        finally:
            connections["default"].close()

    snapshot_taken, other_committed = threading.Event(), threading.Event()
    thread = threading.Thread(target=repeatable_read_sender, args=(snapshot_taken, other_committed))
    thread.start()
    assert snapshot_taken.wait(5)
    django_outbox.send("t", {}, key="k")  # commits after the snapshot
    other_committed.set()
    thread.join(10)
    error = outcome["error"]
    assert isinstance(error, django_outbox.KeyConflict), error
    assert "REPEATABLE READ or SERIALIZABLE" in str(error)
    assert "Retry the whole transaction" in str(error)
    assert list(OutboxMessage.objects.values_list("sequence", flat=True).order_by("sequence")) == [
        1,
        2,
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_notify_mode_queues_the_notification_in_the_insert_itself(
    configure_outbox, django_assert_num_queries
):
    import psycopg
    from django.db import connection

    configure_outbox(DISPATCH="notify")
    info = connection.settings_dict
    listener = psycopg.connect(
        host=info["HOST"] or "127.0.0.1",
        port=info["PORT"] or 5432,
        dbname=connection.settings_dict["NAME"],
        user=info["USER"] or "postgres",
        autocommit=True,
    )
    listener.execute('LISTEN "django_outbox"')
    try:
        with transaction.atomic():
            with django_assert_num_queries(2):  # one INSERT per send(), nothing else
                django_outbox.send("order.created", {"id": 1})
                django_outbox.send("order.created", {"id": 2})
            assert not list(listener.notifies(timeout=0.2, stop_after=1))  # not before commit
        [notification] = list(listener.notifies(timeout=2, stop_after=1))
        assert (notification.channel, notification.payload) == ("django_outbox", "outbox")
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_leaves_no_ids_for_the_next_one(dispatched):
    """The next transaction on the connection dispatches its own rows only (the
    trigger of one that rolled back never fired, and was reused: its ids went out with
    the next commit, and a process whose sends kept rolling back grew its list)."""
    with pytest.raises(RuntimeError), transaction.atomic():
        for n in range(3):
            django_outbox.send("order.created", {"n": n})
        raise RuntimeError("business failure")
    with transaction.atomic():
        kept = django_outbox.send("order.created", {"n": "kept"})
    assert dispatched == [[kept.pk]]


def test_message_ids_are_time_ordered_so_each_new_one_lands_at_the_end_of_its_index():
    first = django_outbox.send("order.created", {"n": 1}, to="default")
    time.sleep(0.002)
    second = django_outbox.send("order.created", {"n": 2}, to="default")

    stored = list(OutboxMessage.objects.order_by("message_id").values_list("pk", flat=True))
    assert first.message_id.version == second.message_id.version == 7
    assert stored == [first.pk, second.pk]  # the database's own order of the ids
