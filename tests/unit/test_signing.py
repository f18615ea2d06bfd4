"""Signatures: v2 covers the timestamp, the envelope's headers and the body, unambiguously."""

import hashlib
import hmac

import pytest

from django_outbox import signing

BODY = b'{"a":1}'
HEADERS = {
    "outbox-message-id": "m-1",
    "outbox-type": "order.paid",
    "outbox-key": "order:1",
    "outbox-sequence": "2",
    "outbox-correlation-id": "c-1",
    "outbox-reply-to": "payments",
    "Idempotency-Key": "m-1",
    "Content-Type": "application/json",
    "User-Agent": "python-httpx/0.28",
}


def sign(headers=HEADERS, body=BODY, secret="s3cret", timestamp=1_000):
    return signing.sign(secret, body, headers=headers, timestamp=timestamp)


def verify(header, headers=HEADERS, body=BODY, secret="s3cret", now=1_010, **kwargs):
    return signing.verify(secret, body, header, headers=headers, now=now, **kwargs)


def test_a_signature_verifies_with_the_same_secret_headers_and_body():
    header = sign()
    assert header.startswith("t=1000,v2=")
    assert verify(header)
    assert signing.check("s3cret", BODY, header, headers=HEADERS, now=1_010) == "v2"


def test_the_canonical_form_is_netstrings_of_scheme_time_count_sorted_headers_and_body():
    # The worked example of docs/inbox.md (digest checked with `openssl dgst -sha256 -hmac`):
    # a sender in another language tests against it.
    headers = {"Outbox-Type": "order.paid", "outbox-message-id": "m-1", "X-Other": "no"}
    assert signing.canonical(1_767_225_600, headers, b'{"a":1}') == (
        b"9:outbox-v2,10:1767225600,1:2,"
        b"17:outbox-message-id,3:m-1,11:outbox-type,10:order.paid,"
        b'7:{"a":1},'
    )
    expected = hmac.new(
        b"s3cret", signing.canonical(1_767_225_600, headers, b'{"a":1}'), hashlib.sha256
    ).hexdigest()
    assert signing.sign("s3cret", b'{"a":1}', headers=headers, timestamp=1_767_225_600) == (
        f"t=1767225600,v2={expected}"
    )
    assert expected == "bef098665160b9c351568c640cf3640df040ddde26a4685dd9ed95594a002325"


@pytest.mark.parametrize(
    "change",
    [
        {"outbox-message-id": "m-2"},
        {"outbox-type": "order.refunded"},
        {"outbox-key": "order:2"},
        {"outbox-sequence": "3"},
        {"outbox-correlation-id": "c-2"},
        {"outbox-reply-to": "elsewhere"},
        {"Idempotency-Key": "m-2"},
        {"outbox-extra": "added"},
        {"outbox-reply-to": None},
        {"Idempotency-Key": None},
        {"outbox-correlation-id": ""},
    ],
)
def test_any_change_to_the_envelope_breaks_the_signature(change):
    header = sign()
    headers = {**HEADERS, **change}
    headers = {name: value for name, value in headers.items() if value is not None}
    assert not verify(header, headers=headers)
    with pytest.raises(signing.SignatureError, match="bad signature") as caught:
        signing.check("s3cret", BODY, header, headers=headers, now=1_010)
    assert caught.value.kind == "bad"


def test_the_body_the_secret_and_the_timestamp_are_covered():
    header = sign()
    assert not verify(header, body=b'{"a":2}')
    assert not verify(header, secret="other")
    assert not verify(header.replace("t=1000", "t=1001"))
    with pytest.raises(signing.SignatureError, match="outside the 300 s window") as caught:
        signing.check("s3cret", BODY, header, headers=HEADERS, now=1_000 + 301)
    assert caught.value.kind == "stale"


def test_other_headers_and_the_case_of_names_do_not_matter():
    header = sign()
    relaxed = {name.upper(): value for name, value in HEADERS.items()}
    relaxed.update({"USER-AGENT": "curl", "Host": "billing.example", "Content-Type": "text/plain"})
    assert verify(header, headers=relaxed)


def test_missing_and_empty_headers_sign_differently():
    without = signing.canonical(1, {"outbox-message-id": "m"}, b"")
    empty = signing.canonical(1, {"outbox-message-id": "m", "outbox-key": ""}, b"")
    assert without != empty


@pytest.mark.parametrize(
    ("one", "other"),
    [
        # What naive "name:value" joining would run together.
        ({"outbox-a": "b,outbox-c:d"}, {"outbox-a": "b", "outbox-c": "d"}),
        ({"outbox-a": "1:x,"}, {"outbox-a": "1", "outbox-x": ""}),
        ({"outbox-ab": ""}, {"outbox-a": "b"}),
    ],
)
def test_different_envelopes_never_encode_alike(one, other):
    assert signing.canonical(1, one, b"") != signing.canonical(1, other, b"")
    assert signing.canonical(1, one, b"x") != signing.canonical(1, one, b"")


def test_values_are_bytes_as_sent_str_as_utf8_and_server_text_back_to_bytes():
    sent = {"outbox-key": "city:Zürich"}
    # A WSGI or ASGI server hands the UTF-8 bytes over as one Latin-1 character each.
    received = {"Outbox-Key": "city:Zürich".encode().decode("latin-1")}
    header = signing.sign("s", b"", headers=sent, timestamp=1)
    assert signing.verify("s", b"", header, headers=signing.wire_headers(received), now=1)
    assert not signing.verify("s", b"", header, headers=received, now=1)
    assert signing.wire_headers({"outbox-key": "Zürich"}) == {"outbox-key": b"Z\xfcrich"}


def test_mapped_headers_are_covered_when_named():
    headers = {"X-Event-Id": "evt_1", "outbox-type": "t"}
    header = signing.sign("s", b"", headers=headers, also_cover=["x-event-id"], timestamp=1)
    assert signing.verify("s", b"", header, headers=headers, also_cover=["X-Event-Id"], now=1)
    forged = {**headers, "X-Event-Id": "evt_2"}
    assert not signing.verify("s", b"", header, headers=forged, also_cover=["X-Event-Id"], now=1)
    # A receiver that maps it refuses a signature that did not cover it.
    bare = signing.sign("s", b"", headers=headers, timestamp=1)
    assert not signing.verify("s", b"", bare, headers=headers, also_cover=["X-Event-Id"], now=1)


def test_names_that_differ_only_in_case_are_refused():
    twice = {"outbox-key": "a", "Outbox-Key": "b"}
    with pytest.raises(ValueError, match="differ only in case"):
        signing.sign("s", b"", headers=twice)
    with pytest.raises(signing.SignatureError) as caught:
        signing.check("s", b"", "t=1,v2=00", headers=twice, now=1)
    assert caught.value.kind == "headers"


def v1(body=BODY, timestamp=1_000):
    digest = hmac.new(b"s3cret", b"%d." % timestamp + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def test_v1_is_refused_unless_accepted_and_never_a_fallback_for_v2():
    with pytest.raises(signing.SignatureError, match="v1 signatures do not cover") as caught:
        signing.check("s3cret", BODY, v1(), headers=HEADERS, now=1_010)
    assert caught.value.kind == "v1"
    assert signing.check("s3cret", BODY, v1(), headers={}, now=1_010, accept_v1=True) == "v1"
    assert not verify(v1(body=b"{}"), accept_v1=True)
    assert not verify(v1(timestamp=100), accept_v1=True)
    # A forged v2 next to a valid v1: judged by the v2.
    forged = sign(headers={**HEADERS, "outbox-key": "order:2"}) + "," + v1().split(",")[1]
    assert not verify(forged, accept_v1=True)


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        (None, "missing"),
        ("", "missing"),
        ("garbage", "malformed"),
        ("t=abc,v2=00", "malformed"),
        ("v2=00", "malformed"),
        ("t=1000", "malformed"),
        ("t=1000,v2=", "malformed"),
        ("t=1000,v2=zz", "bad"),
        ("t=1000,v2=é", "bad"),
    ],
)
def test_malformed_headers_are_refused_not_raised(header, kind):
    assert not verify(header)
    with pytest.raises(signing.SignatureError) as caught:
        signing.check("s3cret", BODY, header, headers=HEADERS, now=1_000)
    assert caught.value.kind == kind


def test_a_secret_is_required():
    with pytest.raises(ValueError, match="secret"):
        signing.sign("", BODY, headers=HEADERS)
    with pytest.raises(ValueError, match="secret"):
        signing.check("", BODY, sign(), headers=HEADERS)


# Batches (``b2=``): the same HMAC under another scheme name, so neither kind passes
# for the other.


def test_a_batch_signature_checks_against_its_body_and_time():
    body = b'{"messages": []}'
    header = signing.sign_batch("s", body, timestamp=1_000)
    assert signing.is_batch(header)
    signing.check_batch("s", body, header, now=1_100)
    with pytest.raises(signing.SignatureError, match="bad signature"):
        signing.check_batch("s", body + b" ", header, now=1_100)
    with pytest.raises(signing.SignatureError, match="bad signature"):
        signing.check_batch("other", body, header, now=1_100)
    with pytest.raises(signing.SignatureError, match="window") as stale:
        signing.check_batch("s", body, header, now=1_000 + 301)
    assert stale.value.kind == "stale"


def test_a_single_signature_is_never_a_batch_one_nor_the_other_way():
    body = b'{"n": 1}'
    single = signing.sign("s", body, headers={}, timestamp=1_000)
    batch = signing.sign_batch("s", body, timestamp=1_000)
    assert not signing.is_batch(single)
    # The digests differ: the scheme's name is the first thing hashed.
    assert single.split("v2=")[1] != batch.split("b2=")[1]
    with pytest.raises(signing.SignatureError, match="bad signature"):
        signing.check_batch("s", body, single.replace("v2=", "b2="), now=1_000)
    with pytest.raises(signing.SignatureError, match="no b2= digest"):
        signing.check_batch("s", body, single, now=1_000)
    with pytest.raises(signing.SignatureError, match="no v2= digest"):
        signing.check("s", body, batch, headers={}, now=1_000)
