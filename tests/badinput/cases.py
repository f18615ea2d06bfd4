"""Bad input, catalogued: per entry point, every bad input tried and what it gets.

The cases are data. ``tests/badinput/test_*.py`` run each one against the real
code (real database; real RabbitMQ and Redis for the broker consumer; a Celery
message through Redis for the Celery intake) and assert its outcome and that
nothing accepted was lost and nothing refused was half stored (rows of every
table counted before and after; a broker's queue empty afterwards: acknowledged
and recorded, never dropped). ``python -m tests.badinput.render`` writes
``docs/reference/bad-input.md`` from this module; a test fails when it is stale.

A case's ``given`` is read by its entry point's test module (its keys are that
module's); ``expect`` is what a reader of the table needs: the kind of outcome,
what it is (exception class, state, HTTP status, check id), a fragment of its
text, and what is stored afterwards.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Kinds of outcome, as the table says them.
RAISES = "raises"  # an exception, nothing stored
ACCEPTED = "accepted"  # stored (and handled) as a message/job like any other
KEPT = "kept as handle_error"  # an inbox row in handle_error with the reason, acknowledged
REFUSED = "HTTP"  # an HTTP answer with the reason in its JSON body
FAILED = "failed"  # stored, then failed by the worker with the reason, not retried
UNCHANGED = "left as it was"  # an admin action that changes nothing and says why
CHECK = "system check"  # a system check error; get_settings() raises the same text
#: A message of a webhook batch refused alone (its result in the 200 answer), the others
#: of the batch stored.
ALONE = "refused alone"


@dataclass(frozen=True)
class Expect:
    kind: str
    #: Exception class, state, HTTP status or check id.
    what: str
    #: A fragment of the exception's text, the row's last_error or the answer's reason.
    says: str
    #: What is stored afterwards, for the table.
    stored: str


@dataclass(frozen=True)
class Case:
    id: str
    #: The input, for a human.
    input: str
    given: Mapping[str, Any]
    expect: Expect
    #: pytest markers the case needs (``postgres`` …).
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class EntryPoint:
    name: str
    title: str
    about: str
    test: str
    cases: tuple[Case, ...] = field(default_factory=tuple)


def nested(depth: int) -> Any:
    """A list nested *depth* deep (deeper than json can encode at the default limit)."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


NOTHING = "nothing"
ONE_ROW = "one outbox row, should_be_sent"
KEPT_ROW = "one inbox row, handle_error, raw body kept"


def _raises(what: str, says: str) -> Expect:
    return Expect(RAISES, what, says, "nothing; the caller's transaction still usable")


# -- send() ------------------------------------------------------------------------

SEND = EntryPoint(
    "send",
    "`django_outbox.send()`",
    "Checked before the database is touched: a refused call raises and leaves the "
    "caller's transaction usable (the test sends a good message in it afterwards).",
    "tests/badinput/test_send.py",
    (
        Case(
            "payload-none", "payload `None`", {"payload": None}, _raises("PayloadError", "is None")
        ),
        Case(
            "payload-set",
            "a `set` in the payload",
            {"payload": {"ids": {1, 2}}},
            _raises("PayloadError", "is not JSON-serializable: Object of type set"),
        ),
        Case(
            "payload-bytes",
            "`bytes` in the payload",
            {"payload": {"raw": b"\x00\x01"}},
            _raises("PayloadError", "Object of type bytes is not JSON serializable"),
        ),
        Case(
            "payload-object",
            "an arbitrary object in the payload",
            {"payload": {"o": object()}},
            _raises("PayloadError", "Object of type object is not JSON serializable"),
        ),
        Case(
            "payload-nan",
            "`float('nan')` in the payload",
            {"payload": {"x": float("nan")}},
            _raises("PayloadError", "Out of range float values are not JSON compliant"),
        ),
        Case(
            "payload-inf",
            "`float('inf')` in the payload",
            {"payload": [float("inf")]},
            _raises("PayloadError", "Out of range float values are not JSON compliant"),
        ),
        Case(
            "payload-nul",
            "a NUL character in a payload string",
            {"payload": {"name": "a\x00b"}},
            _raises("PayloadError", "contains a NUL character (\\u0000)"),
        ),
        Case(
            "payload-surrogate",
            "a lone surrogate (`'\\ud800'`) in a payload string",
            {"payload": {"name": "\ud800"}},
            _raises("PayloadError", "surrogates not allowed"),
        ),
        Case(
            "payload-deep",
            "a payload nested 100,000 deep",
            {"payload": nested(100_000)},
            _raises("PayloadError", "nested too deeply to serialize"),
        ),
        Case(
            "payload-oversize",
            "a payload over `MAX_PAYLOAD_BYTES` (1,000)",
            {"payload": {"blob": "x" * 2000}, "max_payload_bytes": 1000},
            _raises("PayloadTooLarge", "MAX_PAYLOAD_BYTES is 1000"),
        ),
        Case(
            "type-empty",
            "type `''`",
            {"type": ""},
            _raises("InvalidMessage", "type must be a non-empty string"),
        ),
        Case(
            "type-not-text",
            "type `42`",
            {"type": 42},
            _raises("InvalidMessage", "type must be a non-empty string, got 42"),
        ),
        Case(
            "type-too-long",
            "a type of 256 characters",
            {"type": "t" * 256},
            _raises("InvalidMessage", "type is 256 characters; the limit is 255"),
        ),
        Case(
            "type-newline",
            "a type with a line break",
            {"type": "order\npaid"},
            _raises("InvalidMessage", "contains control characters"),
        ),
        Case(
            "key-nul",
            "a key with a NUL character",
            {"key": "order:\x00"},
            _raises("InvalidMessage", "key 'order:\\x00' contains control characters"),
        ),
        Case(
            "key-empty",
            "key `''`",
            {"key": ""},
            _raises("InvalidMessage", "key must be a non-empty string"),
        ),
        Case(
            "headers-not-mapping",
            "headers as a list of pairs",
            {"headers": [("a", "b")]},
            _raises("PayloadError", "headers must be a mapping of strings, got list"),
        ),
        Case(
            "header-not-text",
            "a header value `1` (int)",
            {"headers": {"x-n": 1}},
            _raises("PayloadError", "header names and values must be strings; bad: ['x-n']"),
        ),
        Case(
            "header-crlf",
            "a header value with CR/LF (header injection)",
            {"headers": {"x-a": "1\r\nx-b: 2"}},
            _raises("PayloadError", "contains control characters"),
        ),
        Case(
            "correlation-too-long",
            "a correlation id of 256 characters",
            {"correlation_id": "c" * 256},
            _raises("InvalidMessage", "correlation_id is 256 characters"),
        ),
        Case(
            "reply-to-empty",
            "reply_to `''`",
            {"reply_to": ""},
            _raises("InvalidMessage", "reply_to must be a non-empty string"),
        ),
        Case(
            "unknown-destination",
            "to `'nowhere'` (not configured)",
            {"to": "nowhere"},
            _raises("UnknownDestination", "'nowhere'"),
        ),
        Case(
            "payload-decimal-datetime",
            "a `Decimal` and a `datetime` in the payload",
            {
                "payload": {
                    "amount": decimal.Decimal("9.99"),
                    "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
                }
            },
            Expect(
                ACCEPTED,
                "should_be_sent",
                "",
                "one outbox row; payload as published: "
                '`{"amount": "9.99", "at": "2026-01-02T03:04:05Z"}`',
            ),
        ),
        Case(
            "payload-int-keys",
            "integer dict keys in the payload",
            {"payload": {1: "a"}},
            Expect(ACCEPTED, "should_be_sent", "", 'one outbox row; payload `{"1": "a"}`'),
        ),
    ),
)


# -- receive() ----------------------------------------------------------------------

RECEIVE = EntryPoint(
    "receive",
    "`django_outbox.receive()` (inbox API)",
    "Checked before the database is touched, like `send()`. A duplicate is not an "
    "error: it returns the stored row with `created=False`.",
    "tests/badinput/test_receive.py",
    (
        Case(
            "id-empty",
            "message_id `''`",
            {"message_id": ""},
            _raises("InvalidMessage", "message_id must be a non-empty string"),
        ),
        Case(
            "id-none",
            "message_id `None`",
            {"message_id": None},
            _raises("InvalidMessage", "message_id must be a non-empty string, got None"),
        ),
        Case(
            "id-too-long",
            "a message id of 256 characters",
            {"message_id": "m" * 256},
            _raises("InvalidMessage", "message_id is 256 characters; the limit is 255"),
        ),
        Case(
            "id-nul",
            "a message id with a NUL character",
            {"message_id": "m-\x00"},
            _raises("InvalidMessage", "contains control characters"),
        ),
        Case(
            "source-empty",
            "source `''`",
            {"source": ""},
            _raises("InvalidMessage", "source must be a non-empty string"),
        ),
        Case(
            "source-too-long",
            "a source of 101 characters",
            {"source": "s" * 101},
            _raises("InvalidMessage", "source is 101 characters; the limit is 100"),
        ),
        Case(
            "sequence-negative",
            "sequence `-1`",
            {"key": "k", "sequence": -1},
            _raises("InvalidMessage", "sequence must be a non-negative integer, got -1"),
        ),
        Case(
            "sequence-text",
            "sequence `'3'` (a string)",
            {"key": "k", "sequence": "3"},
            _raises("InvalidMessage", "sequence must be a non-negative integer, got '3'"),
        ),
        Case(
            "sequence-bool",
            "sequence `True`",
            {"key": "k", "sequence": True},
            _raises("InvalidMessage", "got True"),
        ),
        Case(
            "sequence-too-big",
            "sequence `2**63` (beyond BIGINT)",
            {"key": "k", "sequence": 2**63},
            _raises("InvalidMessage", "is out of range: at most 9223372036854775807"),
        ),
        Case(
            "sequence-without-key",
            "a sequence without a key",
            {"sequence": 1},
            _raises("InvalidMessage", "a sequence needs a key"),
        ),
        Case(
            "payload-nan",
            "`NaN` in the payload",
            {"payload": {"x": float("nan")}},
            _raises("PayloadError", "Out of range float values"),
        ),
        Case(
            "payload-nul",
            "a NUL character in a payload string",
            {"payload": ["\x00"]},
            _raises("PayloadError", "contains a NUL character"),
        ),
        Case(
            "payload-set",
            "a `set` in the payload",
            {"payload": {1, 2}},
            _raises("PayloadError", "Object of type set is not JSON serializable"),
        ),
        Case(
            "header-nul",
            "a header value with a NUL character",
            {"headers": {"x-a": "\x00"}},
            _raises("PayloadError", "contains control characters"),
        ),
        Case(
            "duplicate",
            "the same (source, message_id) twice",
            {"twice": True},
            Expect(
                ACCEPTED,
                "created=False",
                "",
                "one inbox row (the first); the second call stores and triggers nothing",
            ),
        ),
        Case(
            "unknown-type",
            "a type no handler is registered for",
            {"type": "nobody.handles.this", "handle": True},
            Expect(
                ACCEPTED,
                "handle_error",
                "no handler for type 'nobody.handles.this'",
                "one inbox row, handle_error once handled (the reason names the fix)",
            ),
        ),
    ),
)


# -- the kombu consumer --------------------------------------------------------------

_KEPT = KEPT_ROW + "; acknowledged"


def _kept(says: str, stored: str = _KEPT) -> Expect:
    return Expect(KEPT, "handle_error", says, stored)


KOMBU = EntryPoint(
    "kombu",
    "The kombu consumer (`manage.py inbox_consume`, RabbitMQ and Redis)",
    "Each case is published raw to a real queue, on RabbitMQ and on Redis, and consumed "
    "by `inbox_consume`. What cannot be a message is stored as `handle_error` with its "
    "raw body and the reason, and acknowledged: the queue is empty afterwards and the "
    "message is never redelivered or dropped. Headers are `outbox-message-id`, "
    "`outbox-type` … unless a case says otherwise.",
    "tests/badinput/test_kombu.py",
    (
        Case(
            "not-json",
            "body `{not json`",
            {"body": b"{not json"},
            _kept("unreadable: body is not UTF-8 JSON"),
        ),
        Case(
            "not-utf8",
            "body bytes `\\xff\\xfe` (not UTF-8)",
            {"body": b'{"a": "\xff\xfe"}'},
            _kept("body is not UTF-8 JSON", KEPT_ROW + " (`\\xff\\xfe` escaped); acknowledged"),
        ),
        Case(
            "raw-nul",
            "a raw NUL byte inside a JSON string",
            {"body": b'{"a": "x\x00y"}'},
            _kept("body is not UTF-8 JSON: Invalid control character"),
        ),
        Case(
            "escaped-nul",
            'JSON `"\\u0000"` (a NUL once decoded)',
            {"body": b'{"a": "\\u0000"}'},
            _kept("contains a NUL character"),
        ),
        Case(
            "nan",
            "JSON `NaN` (Python's json reads it)",
            {"body": b'{"x": NaN}'},
            _kept("Out of range float values are not JSON compliant"),
        ),
        Case(
            "content-type",
            "content type `application/xml`",
            {"body": b"<a/>", "content_type": "application/xml"},
            _kept("content type 'application/xml' is not JSON"),
        ),
        Case(
            "no-id",
            "no message id (no header, no AMQP message_id)",
            {"headers": {"outbox-message-id": None}},
            _kept(
                "no message id (header or transport property)",
                KEPT_ROW + " under `sha256:<body hash>`; acknowledged",
            ),
        ),
        Case(
            "no-type",
            "no `outbox-type` header, no `DEFAULT_TYPE`",
            {"headers": {"outbox-type": None}},
            _kept("no message type (header, or DEFAULT_TYPE of the source)"),
        ),
        Case(
            "sequence-text",
            "`outbox-sequence: abc` with a key",
            {"headers": {"outbox-key": "o:1", "outbox-sequence": "abc"}},
            _kept("sequence 'abc' is not an integer"),
        ),
        Case(
            "sequence-too-big",
            "`outbox-sequence` of 20 nines",
            {"headers": {"outbox-key": "o:1", "outbox-sequence": "9" * 20}},
            _kept("is out of range"),
        ),
        Case(
            "oversize",
            "a body over the source's `MAX_BODY_BYTES` (200)",
            {"body": b'{"blob": "' + b"x" * 400 + b'"}'},
            _kept(
                "body of 412 bytes is over the limit of 200",
                KEPT_ROW + " (its first 200 bytes, and how many more); acknowledged",
            ),
        ),
        Case(
            "type-nul",
            "a NUL character in the type header",
            {"headers": {"outbox-type": "order\x00paid"}},
            _kept("type 'order\\x00paid' contains control characters"),
        ),
        Case(
            "huge-header",
            "an `outbox-key` header of 10,000 characters",
            {"headers": {"outbox-key": "k" * 10_000}},
            _kept("key is 10000 characters; the limit is 255"),
        ),
        Case(
            "non-ascii-key",
            "`outbox-key: city:Zürich`",
            {"headers": {"outbox-key": "city:Zürich"}},
            Expect(ACCEPTED, "handled", "", "one inbox row, key `city:Zürich`; acknowledged"),
        ),
        Case(
            "duplicate",
            "the same message id published twice",
            {"twice": True},
            Expect(ACCEPTED, "handled", "", "one inbox row, handled once; both acknowledged"),
        ),
        Case(
            "unknown-type",
            "a type no handler is registered for",
            {"headers": {"outbox-type": "nobody.handles.this"}},
            _kept(
                "no handler for type 'nobody.handles.this'",
                "one inbox row, handle_error; acknowledged",
            ),
        ),
    ),
)


# -- the Celery intake -----------------------------------------------------------------

CELERY = EntryPoint(
    "celery",
    "The Celery intake (task `django_outbox.receive`)",
    "Each case is sent as another service's `celery` transport sends it (`send_task` "
    "through Redis, the payload as argument, the message id as task id, `outbox-*` task "
    "headers), taken from the queue and run by Celery's own worker request "
    "(`celery.worker.request.Request`, acknowledged late as the task says). The queue "
    "is empty afterwards.",
    "tests/badinput/test_celery.py",
    (
        Case(
            "no-type",
            "no `outbox-type` task header",
            {"headers": {"outbox-type": None}},
            _kept("no message type", "one inbox row, handle_error, raw body kept; acknowledged"),
        ),
        Case(
            "type-nul",
            "a NUL character in `outbox-type`",
            {"headers": {"outbox-type": "order\x00paid"}},
            _kept("contains control characters", "one inbox row, handle_error; acknowledged"),
        ),
        Case(
            "nan",
            "`NaN` in the payload (kombu's JSON reads it)",
            {"payload": {"x": float("nan")}},
            _kept("Out of range float values", "one inbox row, handle_error; acknowledged"),
        ),
        Case(
            "nul",
            "a NUL character in the payload",
            {"payload": {"x": "\x00"}},
            _kept("contains a NUL character", "one inbox row, handle_error; acknowledged"),
        ),
        Case(
            "sequence-text",
            "`outbox-sequence: abc` with a key",
            {"headers": {"outbox-key": "o:1", "outbox-sequence": "abc"}},
            _kept("sequence 'abc' is not an integer", "one inbox row, handle_error; acknowledged"),
        ),
        Case(
            "oversize",
            "a payload over the source's `MAX_BODY_BYTES` (200)",
            {"payload": {"blob": "x" * 400}},
            _kept("is over the limit of 200", "one inbox row, handle_error, first 200 bytes kept"),
        ),
        Case(
            "duplicate",
            "the same task id delivered twice",
            {"twice": True},
            Expect(ACCEPTED, "handled", "", "one inbox row, handled once; both acknowledged"),
        ),
        Case(
            "no-payload",
            "the task called without its payload argument",
            {"args": []},
            _kept(
                "task arguments are not (payload,)",
                "one inbox row, handle_error; acknowledged",
            ),
        ),
        Case(
            "using",
            "a `using` keyword naming a database (the receiver's router decides, not the sender)",
            {"kwargs": {"using": "other"}},
            _kept(
                "and the keywords ['using']",
                "one inbox row in the router's database, handle_error; acknowledged",
            ),
        ),
    ),
)


# -- the webhook view -------------------------------------------------------------------

SIGNED = "nothing (the answer's JSON says why; a WARNING log line)"


def _http(status: int, says: str, stored: str = SIGNED) -> Expect:
    return Expect(REFUSED, str(status), says, stored)


WEBHOOK = EntryPoint(
    "webhook",
    "The webhook view (`inbox/<source>/`)",
    "Posted with Django's test client; header values are given to the view as a WSGI "
    "server gives them (each byte one Latin-1 character). Signed with the source's "
    "secret unless the case says otherwise. Refused requests store nothing: the sender "
    "sees why and can fix them.",
    "tests/badinput/test_webhook.py",
    (
        Case("get", "a GET", {"method": "get"}, _http(405, "POST only")),
        Case(
            "unknown-source", "source `nobody`", {"source": "nobody"}, _http(404, "unknown source")
        ),
        Case(
            "kombu-source",
            "a source that is not a webhook source",
            {"source": "queue"},
            _http(404, "does not take webhooks"),
        ),
        Case(
            "oversize",
            "a body over `MAX_BODY_BYTES` (1,000)",
            {"body": b'{"blob": "' + b"x" * 2000 + b'"}'},
            _http(413, "is over 1000"),
        ),
        Case(
            "no-signature",
            "no `Outbox-Signature` header",
            {"sign": "none"},
            _http(401, "no Outbox-Signature header"),
        ),
        Case(
            "malformed-signature",
            "`Outbox-Signature: garbage`",
            {"sign": "garbage"},
            _http(401, "malformed Outbox-Signature header"),
        ),
        Case(
            "wrong-secret",
            "signed with another secret",
            {"sign": "other-secret"},
            _http(401, "bad signature"),
        ),
        Case(
            "expired",
            "signed an hour ago",
            {"sign": "an-hour-ago"},
            _http(401, "outside the 300 s window"),
        ),
        Case(
            "v1-only",
            "a v1 signature only (body, not envelope)",
            {"sign": "v1"},
            _http(401, "ACCEPT_V1"),
        ),
        Case(
            "retyped",
            "`outbox-type` changed after signing",
            {"sign": "then-retype"},
            _http(401, "bad signature"),
        ),
        Case("not-json", "body `{not json`", {"body": b"{not json"}, _http(400, "not UTF-8 JSON")),
        Case(
            "not-utf8",
            "body bytes `\\xff` (not UTF-8)",
            {"body": b'"\xff"'},
            _http(400, "body is not UTF-8 JSON"),
        ),
        Case(
            "content-type",
            "content type `text/xml`",
            {"content_type": "text/xml"},
            _http(400, "content type 'text/xml' is not JSON"),
        ),
        Case(
            "no-id",
            "no `outbox-message-id`, no `Idempotency-Key`",
            {"headers": {"outbox-message-id": None}},
            _http(400, "no message id"),
        ),
        Case(
            "no-type",
            "no `outbox-type`",
            {"headers": {"outbox-type": None}},
            _http(400, "no message type"),
        ),
        Case(
            "nul",
            'JSON `"\\u0000"` in the body',
            {"body": b'{"a": "\\u0000"}'},
            _http(400, "contains a NUL character"),
        ),
        Case("nan", "JSON `NaN` in the body", {"body": b"[NaN]"}, _http(400, "Out of range float")),
        Case(
            "sequence-text",
            "`outbox-sequence: abc` with a key",
            {"headers": {"outbox-key": "o:1", "outbox-sequence": "abc"}},
            _http(400, "sequence 'abc' is not an integer"),
        ),
        Case(
            "huge-header",
            "an `outbox-key` of 10,000 characters",
            {"headers": {"outbox-key": "k" * 10_000}},
            _http(400, "key is 10000 characters; the limit is 255"),
        ),
        Case(
            "control-character",
            "a tab in `outbox-type`",
            {"headers": {"outbox-type": "order\tpaid"}},
            _http(400, "contains control characters"),
        ),
        Case(
            "header-not-utf8",
            "`outbox-key` bytes `\\xfc` (Latin-1, not UTF-8)",
            {"headers": {"outbox-key": b"city:Z\xfcrich"}},
            _http(400, "header 'outbox-key' is not UTF-8 text"),
        ),
        Case(
            "non-ascii-key",
            "`outbox-key: city:Zürich` (UTF-8)",
            {"headers": {"outbox-key": "city:Zürich".encode()}},
            Expect(ACCEPTED, "200", "stored", "one inbox row, key `city:Zürich` as sent"),
        ),
        Case(
            "duplicate",
            "the same signed request twice",
            {"twice": True},
            Expect(ACCEPTED, "200", "duplicate", "one inbox row (the second answer: duplicate)"),
        ),
    ),
)


# -- A batch to the webhook view ---------------------------------------------------------

BATCH_GOOD = "one inbox row, the batch's good message"


def _alone(says: str) -> Expect:
    return Expect(ALONE, "200", says, f"{BATCH_GOOD}; this one nothing (its result says why)")


WEBHOOK_BATCH = EntryPoint(
    "webhook-batch",
    "A batch to the webhook view (`BATCH`, signed `b2=`)",
    "Two messages in one request, as the `http` transport's `BATCH` posts them: the "
    "case's message first, a good one of another key second. A batch that cannot be read "
    "as a whole is refused whole and stores nothing; a message that cannot be read is "
    "refused alone, its result in the answer saying why, and the good one is stored.",
    "tests/badinput/test_webhook_batch.py",
    (
        Case(
            "not-json",
            "a body `{not json`",
            {"raw": b"{not json"},
            _http(400, "malformed batch: not UTF-8 JSON"),
        ),
        Case(
            "no-messages",
            'a body `{"messages": []}`',
            {"raw": b'{"messages": []}'},
            _http(400, 'no "messages" list'),
        ),
        Case(
            "item-shape",
            "a message whose `body` is a JSON object, not its text",
            {"item": {"body": {"order": "o1"}}},
            _http(400, 'message 0: not {"headers"'),
        ),
        Case(
            "header-number",
            "a header whose value is the number 3",
            {"headers": {"outbox-attempt": 3}},
            _http(400, "header 'outbox-attempt' is not UTF-8 text"),
        ),
        Case(
            "too-many",
            "6 messages (`MAX_BATCH` 5)",
            {"count": 6},
            _http(400, "over MAX_BATCH (5)"),
        ),
        Case(
            "too-large",
            "a body over `MAX_BATCH_BYTES` (4,000)",
            {"body": b'{"blob": "' + b"x" * 4000 + b'"}'},
            _http(413, "is over 4000"),
        ),
        Case(
            "single-signature",
            "signed as one message (`v2=`) where a batch is posted",
            {"sign": "single"},
            _http(400, "no message id"),
        ),
        Case(
            "wrong-secret",
            "signed with another secret",
            {"sign": "other-secret"},
            _http(401, "bad signature"),
        ),
        Case(
            "expired",
            "signed an hour ago",
            {"sign": "an-hour-ago"},
            _http(401, "outside the 300 s window"),
        ),
        Case(
            "message-not-json",
            "a message whose body is `{not json`",
            {"body": b"{not json"},
            _alone("body is not UTF-8 JSON"),
        ),
        Case(
            "message-oversize",
            "a message over `MAX_BODY_BYTES` (1,000)",
            {"body": b'{"blob": "' + b"x" * 2000 + b'"}'},
            _alone("over the limit of 1000"),
        ),
        Case(
            "message-no-type",
            "a message without `outbox-type`",
            {"headers": {"outbox-type": None}},
            _alone("no message type"),
        ),
        Case(
            "message-nul",
            'a message with JSON `"\\u0000"` in its body',
            {"body": b'{"a": "\\u0000"}'},
            _alone("contains a NUL character"),
        ),
        Case(
            "message-surrogate",
            'a message whose body text holds a lone surrogate `"\\ud800"`',
            {"body_text": "\ud800"},
            _alone("body is not UTF-8 JSON"),
        ),
        Case(
            "message-twice",
            "the same message id twice in the batch",
            {"twice": True},
            Expect(ACCEPTED, "200", "duplicate", "one inbox row (the second result: duplicate)"),
        ),
    ),
)


# -- enqueue() -------------------------------------------------------------------------

ENQUEUED = "nothing; the caller's transaction still usable"


def _refused_args(says: str) -> Expect:
    return Expect(RAISES, "JobArgumentsError", says, ENQUEUED)


ENQUEUE = EntryPoint(
    "enqueue",
    "`Task.enqueue()` (jobs, Django's Tasks API)",
    "Arguments must come back from JSON as they went in; checked before the INSERT, so "
    "a refused call leaves the caller's transaction usable. A job stored with arguments "
    "its function does not take, or whose task path no longer imports, is failed by "
    "the worker with the reason, not retried.",
    "tests/badinput/test_enqueue.py",
    (
        Case(
            "datetime",
            "a `datetime` argument",
            {"args": [datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)]},
            _refused_args("args[0] is a datetime.datetime, which is not JSON"),
        ),
        Case(
            "decimal",
            "a `Decimal` argument",
            {"args": [decimal.Decimal("1.5")]},
            _refused_args("pass str(value) and make a Decimal of it in the task"),
        ),
        Case("set", "a `set` argument", {"args": [{1}]}, _refused_args("pass a sorted list")),
        Case(
            "bytes",
            "a `bytes` argument",
            {"args": [b"x"]},
            _refused_args("args[0] is bytes, refused here"),
        ),
        Case(
            "nan",
            "`NaN` as a keyword argument",
            {"kwargs": {"value": float("nan")}},
            _refused_args("kwargs['value'] is nan, which JSON cannot hold"),
        ),
        Case(
            "inf",
            "`inf` inside a list",
            {"args": [[1.0, float("inf")]]},
            _refused_args("args[0][1] is inf"),
        ),
        Case(
            "int-key",
            "a dict argument with an integer key",
            {"args": [{1: "a"}]},
            _refused_args("would come back from JSON as '1'"),
        ),
        Case(
            "nul",
            "a NUL character in a string argument",
            {"args": ["a\x00b"]},
            _refused_args("args[0] contains a NUL character (\\u0000)"),
        ),
        Case(
            "nul-key",
            "a NUL character in a dict key",
            {"args": [{"a\x00": 1}]},
            _refused_args("with a NUL character PostgreSQL cannot store"),
        ),
        Case(
            "object",
            "an arbitrary object",
            {"args": [object()]},
            _refused_args("args[0] is a builtins.object, which is not JSON"),
        ),
        Case(
            "unique-key-missing",
            "`unique_key='sync-{customer}'` and no `customer` argument",
            {"task": "testproject.shop.jobs.sync_customer", "args": ["c-1"]},
            _refused_args("unique_key of testproject.shop.jobs.sync_customer could not be made"),
        ),
        Case(
            "wrong-arguments",
            "arguments the function does not take",
            {"task": "tests.badinput.tasks.takes_one", "args": [1, 2], "run": True},
            Expect(
                FAILED,
                "FAILED",
                "takes_one() takes 1 positional argument but 2 were given",
                "one job, FAILED after its attempts, the error and traceback kept",
            ),
        ),
        Case(
            "task-path-gone",
            "a stored job whose task path no longer imports (renamed after enqueue)",
            {"task_path": "tests.badinput.tasks.renamed_away", "run": True},
            Expect(
                FAILED,
                "FAILED",
                'does not define a "renamed_away" attribute',
                "one job, FAILED at once (not retried), the error kept",
            ),
        ),
        Case(
            "not-a-task",
            "a stored job whose path names a plain function",
            {"task_path": "tests.badinput.cases.nested", "run": True},
            Expect(
                FAILED,
                "FAILED",
                "is not a task (decorate it with @task)",
                "one job, FAILED at once (not retried), the error kept",
            ),
        ),
    ),
)


# -- admin actions ----------------------------------------------------------------------

ADMIN = EntryPoint(
    "admin",
    "Admin actions",
    "Posted to the outbox message list and to a row's action URL by a logged-in staff "
    "user. Every case counts the rows in each state before and after: a refused or "
    "inapplicable action changes nothing.",
    "tests/badinput/test_admin.py",
    (
        Case(
            "wrong-state",
            "requeue a message that is `should_be_sent`",
            {"action": "requeue_messages", "state": "should_be_sent"},
            Expect(UNCHANGED, "200", "left as they were: only those in send_error", NOTHING),
        ),
        Case(
            "no-permission",
            "requeue without the requeue permission",
            {"action": "requeue_messages", "permissions": ()},
            Expect(UNCHANGED, "200", "", "nothing changed (the list, as if nothing was posted)"),
        ),
        Case(
            "unknown-action",
            "an action name that does not exist",
            {"action": "drop_table"},
            Expect(UNCHANGED, "200", "No action selected", "nothing changed"),
        ),
        Case(
            "nothing-selected",
            "no rows selected",
            {"action": "requeue_messages", "selected": []},
            Expect(UNCHANGED, "200", "", "nothing changed (the list again, no message)"),
        ),
        Case(
            "forged-id",
            "a selected id `abc`",
            {"action": "requeue_messages", "selected": ["abc"]},
            Expect(REFUSED, "400", "", "nothing changed"),
        ),
        Case(
            "huge-id",
            "a selected id `2**70`",
            {"action": "requeue_messages", "selected": [str(2**70)]},
            Expect(REFUSED, "400", "", "nothing changed"),
        ),
        Case(
            "row-url-malformed",
            "a row action URL with id `1.0`",
            {"row_url": "1.0"},
            Expect(REFUSED, "404", "", "nothing changed"),
        ),
        Case(
            "row-url-missing",
            "a row action URL for a row that does not exist",
            {"row_url": "missing"},
            Expect(REFUSED, "404", "", "nothing changed"),
        ),
        Case(
            "row-url-no-permission",
            "a row action URL without the permission",
            {"row_url": "row", "permissions": ()},
            Expect(REFUSED, "403", "", "nothing changed"),
        ),
    ),
)


# -- management commands ----------------------------------------------------------------


def _command(says: str) -> Expect:
    return Expect(RAISES, "CommandError", says, "nothing; nothing ran")


COMMANDS = EntryPoint(
    "commands",
    "Management commands",
    "Called through `call_command` (from a shell, the same text and exit status 1). "
    "Arguments are validated by the parser before anything runs.",
    "tests/badinput/test_commands.py",
    (
        Case(
            "batch-zero",
            "`outbox_relay --batch 0`",
            {"argv": ["outbox_relay", "--batch", "0"]},
            _command("must be >= 1, got 0"),
        ),
        Case(
            "batch-text",
            "`jobs_worker --batch many`",
            {"argv": ["jobs_worker", "--batch", "many"]},
            _command("expected a whole number, got 'many'"),
        ),
        Case(
            "unconfirmed-batches-negative",
            "`outbox_relay --unconfirmed-batches -1`",
            {"argv": ["outbox_relay", "--unconfirmed-batches", "-1"]},
            _command("must be >= 0, got -1"),
        ),
        Case(
            "interval-negative",
            "`outbox_relay --interval -1`",
            {"argv": ["outbox_relay", "--interval", "-1"]},
            _command("must be >= 0, got -1"),
        ),
        Case(
            "interval-nan",
            "`inbox_worker --interval nan`",
            {"argv": ["inbox_worker", "--interval", "nan"]},
            _command("nan"),
        ),
        Case(
            "unknown-source",
            "`inbox_consume shp` (a typo)",
            {"argv": ["inbox_consume", "shp"]},
            _command("unknown inbox source 'shp'"),
        ),
        Case(
            "requeue-bad-id",
            "`outbox_requeue --id x`",
            {"argv": ["outbox_requeue", "--id", "x"]},
            _command("expected a row id or a UUID, got 'x'"),
        ),
        Case(
            "unknown-option",
            "`outbox_purge --days 3` (no such option)",
            {"argv": ["outbox_purge", "--days", "3"]},
            _command("unrecognized arguments"),
        ),
        Case(
            "unknown-database",
            "`jobs_sweep --database nowhere`",
            {"argv": ["jobs_sweep", "--database", "nowhere"]},
            Expect(
                RAISES,
                "ConnectionDoesNotExist",
                "The connection 'nowhere' doesn't exist",
                "nothing; nothing ran (Django's own error, as for `migrate`)",
            ),
        ),
    ),
)


# -- settings ---------------------------------------------------------------------------


def _check(says: str, id: str = "django_outbox.E001") -> Expect:
    return Expect(CHECK, id, says, "nothing: the process refuses to start (`check`)")


SETTINGS = EntryPoint(
    "settings",
    "Settings (`DJANGO_OUTBOX`) and system checks",
    "Each value is set as `DJANGO_OUTBOX` (over the test suite's base); the system check "
    "reports it, and `get_settings()` raises `ConfigurationError` with the same text.",
    "tests/badinput/test_settings.py",
    (
        Case(
            "not-a-dict", "`DJANGO_OUTBOX = []`", {"value": []}, _check("must be a dict, got list")
        ),
        Case(
            "typo",
            "`BATCH_SIZ` (a typo)",
            {"set": {"BATCH_SIZ": 10}},
            _check("'BATCH_SIZ'"),
        ),
        Case(
            "number-as-text",
            "`BATCH_SIZE: '100'`",
            {"set": {"BATCH_SIZE": "100"}},
            _check("BATCH_SIZE'] must be a number, got '100'"),
        ),
        Case("zero", "`BATCH_SIZE: 0`", {"set": {"BATCH_SIZE": 0}}, _check("must be >= 1, got 0")),
        Case(
            "fraction",
            "`MAX_ATTEMPTS: 1.5`",
            {"set": {"MAX_ATTEMPTS": 1.5}},
            _check("must be an integer, got 1.5"),
        ),
        Case(
            "nan",
            "`RETRY_BASE_SECONDS: nan`",
            {"set": {"RETRY_BASE_SECONDS": float("nan")}},
            _check("must be a finite number, got nan"),
        ),
        Case(
            "bool-as-number",
            "`BATCH_SIZE: True`",
            {"set": {"BATCH_SIZE": True}},
            _check("must be a number, got True"),
        ),
        Case(
            "dispatch",
            "`DISPATCH: 'sometimes'`",
            {"set": {"DISPATCH": "sometimes"}},
            _check("must be one of"),
        ),
        Case(
            "notify-channel",
            "`NOTIFY_CHANNEL: 'a; DROP TABLE x'`",
            {"set": {"NOTIFY_CHANNEL": "a; DROP TABLE x"}},
            _check("NOTIFY_CHANNEL'] must be an identifier"),
        ),
        Case(
            "metrics-text",
            "`METRICS: 'yes'`",
            {"set": {"METRICS": "yes"}},
            _check("METRICS'] must be True or False"),
        ),
        Case(
            "destinations-list",
            "`OUTBOX.DESTINATIONS` as a list",
            {"destinations": []},
            _check("['DESTINATIONS'] must be a dict"),
        ),
        Case(
            "unknown-transport",
            "a destination with `TRANSPORT: 'pigeon'`",
            {"destinations": {"d": {"TRANSPORT": "pigeon"}}},
            _check("pigeon", "django_outbox.E002"),
        ),
        Case(
            "webhook-no-secret",
            "a webhook source without `SECRET`",
            {"sources": {"partner": {"TRANSPORT": "webhook"}}},
            _check("['SECRET'] is required for a webhook source"),
        ),
        Case(
            "accept-v1-text",
            "`ACCEPT_V1: 'yes'`",
            {"sources": {"partner": {"TRANSPORT": "webhook", "SECRET": "s", "ACCEPT_V1": "yes"}}},
            _check("['ACCEPT_V1'] must be True or False"),
        ),
        Case(
            "handle-in-request-text",
            "`HANDLE_IN_REQUEST: 'yes'`",
            {
                "sources": {
                    "partner": {"TRANSPORT": "webhook", "SECRET": "s", "HANDLE_IN_REQUEST": "yes"}
                }
            },
            _check("['HANDLE_IN_REQUEST'] must be True or False"),
        ),
        Case(
            "handle-in-request-kombu",
            "`HANDLE_IN_REQUEST` on a kombu source",
            {
                "sources": {
                    "q": {
                        "TRANSPORT": "kombu",
                        "URL": "memory://",
                        "QUEUE": "q",
                        "HANDLE_IN_REQUEST": True,
                    }
                }
            },
            _check("['HANDLE_IN_REQUEST'] is a webhook source's"),
        ),
        Case(
            "source-name-long",
            "a source name of 101 characters",
            {"sources": {"s" * 101: {"TRANSPORT": "webhook", "SECRET": "s"}}},
            _check("source names are non-empty strings of at most 100"),
        ),
    ),
)


ENTRY_POINTS: tuple[EntryPoint, ...] = (
    SEND,
    RECEIVE,
    KOMBU,
    CELERY,
    WEBHOOK,
    WEBHOOK_BATCH,
    ENQUEUE,
    ADMIN,
    COMMANDS,
    SETTINGS,
)


def case_ids(entry: EntryPoint) -> list[str]:
    return [case.id for case in entry.cases]
