"""Instructions one delivery costs the webhook view and the bare ``INSERT`` view,
counted by valgrind: the same figure on a busy machine as on an idle one.

    python -m tests.benchmarks.webhook_instructions --deliveries 500

The throughput ratio of ``tests.benchmarks.webhook`` moves by a tenth from one run to
the next on two shared cores; a change of a few per cent to the view cannot be told
from that noise. This counts what the Python process executes instead. Each view runs
in a process of its own under ``valgrind --tool=callgrind``, through Django's WSGI
handler (no HTTP server and no client: those are the same for both views), against
service B's database and settings as ``tests.benchmarks.webhook`` sets them. Each
process signs ``--deliveries`` + 50 deliveries, posts 50 to warm up, then either none
or all the others: the difference between the two counts, divided by ``--deliveries``,
is one delivery's own instructions. PostgreSQL's work is not counted.

Needs valgrind (Debian: ``apt install valgrind``). Four runs under valgrind take
about four minutes for 500 deliveries. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from datetime import date

import psycopg

from tests.benchmarks import common, latency, webhook

VIEWS = {"webhook": "/inbox/a/", "bare INSERT": "/bench/bare-insert/a/"}
WARM = 50


def post_in_process(prepared: int, posted: int, path: str) -> None:
    """Sign *prepared* + ``WARM`` deliveries, post ``WARM`` and then *posted* of them to
    *path* through Django's WSGI handler (this process is the one valgrind counts)."""
    os.environ.update(webhook.b_env())
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler

    with psycopg.connect(webhook.B_DB, autocommit=True) as b:
        b.execute("TRUNCATE django_outbox_inbox")
    handler = WSGIHandler()

    def answered(status: str, headers: list[tuple[str, str]]) -> None:
        if not status.startswith("200"):
            raise RuntimeError(f"{path} answered {status}")

    deliveries = [
        _environ(path, body, headers) for body, headers in webhook.prepared(prepared + WARM)
    ]
    for environ in deliveries[: WARM + posted]:
        response = handler(environ, answered)
        b"".join(response)
        response.close()


def _environ(path: str, body: bytes, headers: dict[str, str]) -> dict[str, object]:
    environ: dict[str, object] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": str(webhook.PORT),
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "CONTENT_LENGTH": str(len(body)),
    }
    for name, value in headers.items():
        if name.lower() == "content-type":
            environ["CONTENT_TYPE"] = value
        else:
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def counted(prepared: int, posted: int, path: str, smoke: bool = False) -> int:
    """Instructions valgrind counted in a process posting *posted* deliveries to *path*
    (with *smoke*, the process runs without valgrind and 0 is returned)."""
    arguments = ["--child", str(prepared), str(posted), path]
    return common.instructions(
        "tests.benchmarks.webhook_instructions", arguments, latency.ROOT, None, smoke
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=500)
    common.add_counting_arguments(parser, ("PREPARED", "POSTED", "PATH"))
    args = parser.parse_args()
    if args.child:
        prepared, posted, path = args.child
        post_in_process(int(prepared), int(posted), path)
        return 0
    if common.valgrind_missing(args.smoke):
        return 2
    common.ensure_database(webhook.B_DB)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=latency.ROOT,
        env=webhook.b_env(),
        check=True,
    )
    count = args.deliveries
    per_delivery = {}
    for name, path in VIEWS.items():
        idle, busy = (counted(count, posted, path, args.smoke) for posted in (0, count))
        per_delivery[name] = (busy - idle) / count
    if args.smoke:
        print(f"smoke run: both views answered {count} deliveries; nothing counted")
        return 0
    bare = per_delivery["bare INSERT"]
    print(
        f"\n{date.today()} · valgrind (callgrind) · Python {sys.version.split()[0]} · "
        f"{count} deliveries a view, through Django's WSGI handler\n"
    )
    print("| view | instructions a delivery | of the bare INSERT view's |")
    print("|---|---:|---:|")
    for name, instructions in per_delivery.items():
        print(f"| {name} | {instructions:,.0f} | {instructions / bare:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
