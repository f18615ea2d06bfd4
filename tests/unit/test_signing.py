from django_outbox import signing


def test_signature_verifies_with_the_same_secret_and_body():
    header = signing.sign("s3cret", b'{"a":1}', timestamp=1_000)
    assert signing.verify("s3cret", b'{"a":1}', header, now=1_010)


def test_signature_fails_for_other_secret_body_or_stale_timestamp():
    header = signing.sign("s3cret", b'{"a":1}', timestamp=1_000)
    assert not signing.verify("other", b'{"a":1}', header, now=1_000)
    assert not signing.verify("s3cret", b'{"a":2}', header, now=1_000)
    assert not signing.verify("s3cret", b'{"a":1}', header, now=1_000 + 301)


def test_malformed_headers_are_rejected_not_raised():
    for header in [None, "", "garbage", "t=abc,v1=00", "v1=00", "t=1000"]:
        assert not signing.verify("s3cret", b"{}", header, now=1_000)
