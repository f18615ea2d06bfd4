"""``HANDLE_IN_REQUEST``: a webhook source that handles a sender's first attempt in the
request's own transaction, and leaves a retried delivery to the inbox's workers.

The crash tests serve the view from a real ``runserver`` process and kill it inside the
request: nothing is half done, and the sender's retry is handled exactly once."""

import http.client
import json
import socket
import time
import uuid

import pytest
from django.urls import reverse

import django_outbox
from django_outbox import signing
from django_outbox.engine import triggers
from django_outbox.inbox.handling import Inbox
from django_outbox.models import InboxMessage, InboxState
from django_outbox.outbox.relay import Relay
from testproject.shop.models import Payment
from tests.conftest import spawn_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "in-request-secret"


@pytest.fixture
def in_request(configure_outbox):
    configure_outbox(
        INBOX={
            "SOURCES": {
                "partner": {"TRANSPORT": "webhook", "SECRET": SECRET, "HANDLE_IN_REQUEST": True},
                "later": {"TRANSPORT": "webhook", "SECRET": SECRET},
            }
        }
    )


@pytest.fixture
def woken(monkeypatch):
    """The handlers the view woke: (part, ids) per trigger dispatched after its commit,
    or (part, [id]) per row scheduled to be (``DISPATCH`` is ``none`` in the tests)."""
    calls = []
    monkeypatch.setattr(
        triggers, "dispatch", lambda part, using, ids: calls.append((part, list(ids)))
    )
    monkeypatch.setattr(triggers, "schedule", lambda part, using, pk: calls.append((part, [pk])))
    return calls


def delivery(payload, *, attempt="1", type_="payment.captured", **extra):
    """A signed single delivery: (body, headers) as our ``http`` transport sends it."""
    body = json.dumps(payload).encode()
    headers = {
        "outbox-message-id": str(uuid.uuid4()),
        "outbox-type": type_,
        **({"outbox-attempt": attempt} if attempt is not None else {}),
        **extra,
    }
    headers["Outbox-Signature"] = signing.sign(SECRET, body, headers=headers)
    return body, headers


def post(client, payload, *, source="partner", **options):
    body, headers = delivery(payload, **options)
    response = client.post(
        reverse("django_outbox:webhook", args=[source]),
        data=body,
        content_type="application/json",
        headers=headers,
    )
    return response, headers["outbox-message-id"]


def post_batch(client, items, source="partner"):
    body = json.dumps({"messages": items}).encode()
    return client.post(
        reverse("django_outbox:webhook", args=[source]),
        data=body,
        content_type="application/json",
        headers={"Outbox-Signature": signing.sign_batch(SECRET, body)},
    )


def item(order, attempt="1"):
    headers = {"outbox-message-id": str(uuid.uuid4()), "outbox-type": "payment.captured"}
    if attempt is not None:
        headers["outbox-attempt"] = attempt
    return {"headers": headers, "body": json.dumps({"order": order})}


def state(message_id):
    return InboxMessage.objects.get(message_id=message_id).state


def test_a_first_attempt_is_handled_before_the_answer_and_wakes_no_worker(
    client, in_request, woken
):
    response, message_id = post(client, {"order": "o-1"})
    assert response.status_code == 200
    assert response.json() == {"status": "stored", "message_id": message_id}
    message = InboxMessage.objects.get(message_id=message_id)
    assert message.state == InboxState.HANDLED
    assert message.attempts == 1
    assert list(Payment.objects.values_list("order_ref", flat=True)) == ["o-1"]
    assert woken == []


def test_a_retried_delivery_is_only_stored_and_the_workers_handle_it(client, in_request, woken):
    response, message_id = post(client, {"order": "o-2"}, attempt="2")
    assert response.status_code == 200
    assert response.json()["status"] == "stored"
    assert state(message_id) == InboxState.SHOULD_BE_HANDLED
    assert not Payment.objects.exists()
    [(part, ids)] = woken
    assert part == "inbox" and ids == [InboxMessage.objects.get(message_id=message_id).pk]
    assert Inbox().drain().done == 1
    assert state(message_id) == InboxState.HANDLED
    assert Payment.objects.count() == 1


@pytest.mark.parametrize(
    ("source", "attempt"),
    [("partner", None), ("partner", "one"), ("later", "1")],
    ids=["no-attempt-header", "attempt-not-a-number", "source-without-the-setting"],
)
def test_deliveries_not_known_as_first_attempts_are_only_stored(
    client, in_request, woken, source, attempt
):
    response, message_id = post(client, {"order": "o-3"}, source=source, attempt=attempt)
    assert response.status_code == 200
    assert state(message_id) == InboxState.SHOULD_BE_HANDLED
    assert not Payment.objects.exists()
    assert len(woken) == 1


def test_a_failing_handler_is_recorded_and_the_delivery_still_answered_stored(
    client, in_request, woken
):
    response, message_id = post(client, {"order": "o-4", "fail": True})
    assert response.status_code == 200
    assert response.json()["status"] == "stored"
    message = InboxMessage.objects.get(message_id=message_id)
    assert message.state != InboxState.HANDLED
    assert message.attempts == 1
    assert "cannot capture o-4" in message.last_error
    # The handler's own writes went with its savepoint; the row and its outcome stayed.
    assert not Payment.objects.exists()


def test_a_duplicate_of_a_handled_delivery_runs_nothing_again(client, in_request, woken):
    body, headers = delivery({"order": "o-5"})
    url = reverse("django_outbox:webhook", args=["partner"])
    answers = [
        client.post(url, data=body, content_type="application/json", headers=headers).json()[
            "status"
        ]
        for _ in range(2)
    ]
    assert answers == ["stored", "duplicate"]
    assert Payment.objects.count() == 1


def test_a_batch_of_first_attempts_is_handled_in_its_transaction(client, in_request, woken):
    items = [item(f"b-{n}") for n in range(3)]
    response = post_batch(client, items)
    assert [r["status"] for r in response.json()["results"]] == ["stored"] * 3
    assert set(InboxMessage.objects.values_list("state", flat=True)) == {InboxState.HANDLED}
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == ["b-0", "b-1", "b-2"]
    assert woken == []


def test_a_batch_with_one_retried_message_is_only_stored(client, in_request, woken):
    response = post_batch(client, [item("c-0"), item("c-1", attempt="3"), item("c-2")])
    assert [r["status"] for r in response.json()["results"]] == ["stored"] * 3
    assert set(InboxMessage.objects.values_list("state", flat=True)) == {
        InboxState.SHOULD_BE_HANDLED
    }
    assert not Payment.objects.exists()
    [(part, ids)] = woken
    assert part == "inbox" and len(ids) == 3


def test_a_strict_key_handled_here_wakes_the_workers_for_its_waiting_successor(
    client, in_request, woken
):
    steps = {"outbox-key": "order:9"}
    _, second = post(
        client, {"step": "shipped"}, type_="order.step", attempt="2", **steps, **seq(2)
    )
    assert state(second) == InboxState.SHOULD_BE_HANDLED
    woken.clear()
    _, first = post(client, {"step": "paid"}, type_="order.step", **steps, **seq(1))
    assert state(first) == InboxState.HANDLED
    assert woken == [("inbox", [])], "the successor is due: the workers are woken for it"
    Inbox().drain()
    assert state(second) == InboxState.HANDLED
    steps_handled = Payment.objects.filter(status="step").order_by("pk")
    assert list(steps_handled.values_list("sequence", flat=True)) == [1, 2]


def seq(number):
    return {"outbox-sequence": str(number)}


# -- a real server, killed in the request ----------------------------------------------


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(port, **env):
    server = spawn_manage(
        "runserver", "--noreload", "--nothreading", f"127.0.0.1:{port}", env=subprocess_env(**env)
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stdout.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise AssertionError("runserver did not listen within 30 s")


def deliver(port, body, headers):
    """POST one delivery; its status, or ``None`` if the server died without answering."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST",
            "/inbox/partner/",
            body=body,
            headers={**headers, "Content-Type": "application/json"},
        )
        return connection.getresponse().status
    except (ConnectionError, http.client.RemoteDisconnected):
        return None
    finally:
        connection.close()


def retry_to_a_live_server(port, body, headers):
    """The sender's second attempt of the delivery (*body*, *headers*), to a new server:
    answered 200, and the server still up after it (only stored: its handler ran not)."""
    retried = {**headers, "outbox-attempt": "2"}
    retried["Outbox-Signature"] = signing.sign(SECRET, body, headers=retried)
    server = serve(port)
    try:
        assert deliver(port, body, retried) == 200
        assert server.poll() is None, "the retry was stored, not handled: the server lives"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_server_killed_before_the_commit_keeps_neither_row_nor_effect(in_request, tmp_path):
    body, headers = delivery({"order": "k-1"})
    port = free_port()
    marker = tmp_path / "killed"
    server = serve(
        port, DJANGO_OUTBOX_KILL_AT="inbox.before_commit", DJANGO_OUTBOX_KILL_MARKER=str(marker)
    )
    try:
        assert deliver(port, body, headers) is None
        assert server.wait(timeout=30) == -9
    finally:
        server.kill()
    assert marker.read_text().startswith("inbox.before_commit@1"), "killed at the point"
    # The handler had run (its Payment written) in the transaction that died with it.
    assert not InboxMessage.objects.exists()
    assert not Payment.objects.exists()
    # The sender's next attempt, to a server that lives: stored, and handled once.
    retry_to_a_live_server(port, body, headers)
    Inbox().drain()
    assert state(headers["outbox-message-id"]) == InboxState.HANDLED
    assert Payment.objects.count() == 1


def test_a_poison_message_kills_one_server_then_is_left_to_the_workers(in_request):
    body, headers = delivery({"order": "p-1", "kills_its_worker": True})
    port = free_port()
    server = serve(port)
    try:
        assert deliver(port, body, headers) is None
        assert server.wait(timeout=30) == 70  # the handler's os._exit
    finally:
        server.kill()
    assert not InboxMessage.objects.exists()
    retry_to_a_live_server(port, body, headers)
    assert state(headers["outbox-message-id"]) == InboxState.SHOULD_BE_HANDLED


@pytest.mark.parametrize("batch", [1, 3])
def test_our_http_transport_first_attempt_is_handled_by_the_time_the_relay_is_answered(
    configure_outbox, live_server, batch
):
    url = f"{live_server.url}/inbox/partner/"
    configure_outbox(
        DESTINATIONS={
            "partner": {"TRANSPORT": "http", "URL": url, "SECRET": SECRET, "BATCH": batch}
        },
        INBOX={
            "SOURCES": {
                "partner": {"TRANSPORT": "webhook", "SECRET": SECRET, "HANDLE_IN_REQUEST": True}
            }
        },
    )
    for n in range(3):
        django_outbox.send("payment.captured", {"order": f"t{n}"}, to="partner")
    assert Relay().drain().sent == 3
    assert set(InboxMessage.objects.values_list("state", flat=True)) == {InboxState.HANDLED}
    assert sorted(Payment.objects.values_list("order_ref", flat=True)) == ["t0", "t1", "t2"]
