"""What kind of error a failed row records (``health.failures.error_kind``): the class its
last line names, else that line with what differs from row to row blotted out."""

import pytest

from django_outbox.health.failures import error_kind

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "app/handlers.py", line 12, in handle\n'
    "    raise httpx.HTTPStatusError(...)\n"
    "httpx.HTTPStatusError: Server error '503 Service Unavailable' for url 'https://x/1'\n"
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("ValueError: amount must be positive", "ValueError"),
        ("KeyError", "KeyError"),
        (TRACEBACK, "httpx.HTTPStatusError"),
        ("django_outbox.jobs.WorkerLost: killed", "django_outbox.jobs.WorkerLost"),
        ("HTTP 503", "HTTP 503"),
        ("connection refused", "connection refused"),
        ("order 123456 not found", "order … not found"),
        (
            "message 0b5d7d0e-94d4-4c4f-9f55-0d6e4ee5a0a1 rejected by 7f3a9c1b2e4d5f60",
            "message … rejected by …",
        ),
        ("", "(no error recorded)"),
        ("   \n  ", "(no error recorded)"),
    ],
)
def test_error_kind(text, kind):
    assert error_kind(text) == kind


def test_two_rows_that_failed_alike_have_one_kind():
    assert error_kind("order 1234 not found") == error_kind("order 98765 not found")
    assert error_kind("HTTP 503") != error_kind("HTTP 502")
