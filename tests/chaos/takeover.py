"""Per-cut checks: the other hosts take over a cut-off host's rows, and its late writes
after reconnecting change nothing (fencing).

At the cut, :class:`CutWatch` reads which rows the cut-off host's workers held (a
lease, ``lock_token`` set, ``claimed_by`` one of their worker rows: the worker names
carry the pid). It then polls every 0.2 s: *released* is when none of them is still
held by a cut-off worker, *finished* when all of them reached a final state (through
the other hosts: the cut-off ones cannot write). At the reconnect it keeps the rows
that are finished as they are, and ``fence_wait`` seconds later reads them again:
any difference is a late write of the cut-off host that got through.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

#: Each engine table, and the states in which its rows are finished.
TABLES = {
    "django_outbox_message": ("sent", "send_error", "cancelled"),
    "django_outbox_inbox": ("handled", "skipped", "handle_error"),
    "django_outbox_job": ("SUCCESSFUL", "FAILED"),
}
#: What a late write would change on a finished row.
FENCED_COLUMNS = "state, attempts, claimed_by, lock_token, last_error, locked_until"


class Reader:
    """One autocommit connection to a database that reconnects when a query fails
    (terminated connections, a PostgreSQL restart), for up to *patience* seconds."""

    def __init__(self, url: str, application: str, patience: float = 60.0) -> None:
        self.url = url
        self.application = application
        self.patience = patience
        self._db: psycopg.Connection[Any] | None = None

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                if self._db is None or self._db.closed:
                    self._db = psycopg.connect(
                        self.url,
                        autocommit=True,
                        application_name=self.application,
                        connect_timeout=2,
                    )
                return self._db.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def one(self, sql: str, *params: Any) -> Any:
        found = self.rows(sql, *params)
        return found[0][0] if found else None

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(psycopg.Error):
                self._db.close()
            self._db = None


class CutWatch:
    """What became of one cut-off host's rows (see the module's doc)."""

    def __init__(
        self,
        host: str,
        pids: Sequence[int],
        reader: Reader,
        clock: Callable[[], float],
        fence_wait: float = 5.0,
        give_up: float = 90.0,
    ) -> None:
        self.host = host
        self.pids = list(pids)
        self.db = reader
        self.clock = clock  # seconds since the start of production
        self.fence_wait = fence_wait
        self.give_up = give_up
        self.cut_at: float | None = None
        self.reconnected_at: float | None = None
        self.workers: list[Any] = []
        self.held: dict[str, list[int]] = {}
        self.released: float | None = None
        self.finished: float | None = None
        self.fenced: dict[str, dict[int, tuple[Any, ...]]] = {}
        self.changed: list[str] = []
        self.error: str | None = None
        self._reconnected = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{host}", daemon=True)

    # Called by the cut's thread, right after the link went down / came back up.
    def cut(self) -> None:
        self.cut_at = self.clock()
        try:
            self._snapshot()
        except Exception as exc:  # reported: a watch that could not read is no proof
            self.error = f"snapshot: {exc!r}"[:300]
            self._reconnected.set()
        self._thread.start()

    def reconnect(self) -> None:
        self.reconnected_at = self.clock()
        self._reconnected.set()

    def join(self) -> None:
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join()

    def _snapshot(self) -> None:
        pattern = "|".join(str(pid) for pid in self.pids) or "none"
        self.workers = [
            wid
            for (wid,) in self.db.rows(
                "SELECT id FROM django_outbox_worker WHERE name ~ %s", f":({pattern}) "
            )
        ]
        # Held: leased by a cut-off worker and not finished (a finished row may keep
        # its last lease's token).
        for table, final in TABLES.items():
            self.held[table] = [
                pk
                for (pk,) in self.db.rows(
                    f"SELECT id FROM {table} "  # our own table names
                    "WHERE claimed_by = ANY(%s) AND lock_token IS NOT NULL "
                    "AND NOT (state = ANY(%s))",
                    self.workers,
                    list(final),
                )
            ]

    def _count(self, table: str, condition: str, *params: Any) -> int:
        return int(
            self.db.one(
                f"SELECT count(*) FROM {table} WHERE id = ANY(%s) AND {condition}",
                self.held[table],
                *params,
            )
        )

    def _poll(self) -> None:
        held = finished = 0
        for table, final in TABLES.items():
            if not self.held[table]:
                continue
            held += self._count(
                table,
                "claimed_by = ANY(%s) AND lock_token IS NOT NULL AND NOT (state = ANY(%s))",
                self.workers,
                list(final),
            )
            finished += self._count(table, "state = ANY(%s)", list(final))
        now = self.clock()
        if held == 0 and self.released is None:
            self.released = now
        if finished == sum(len(ids) for ids in self.held.values()) and self.finished is None:
            self.finished = now

    def _fence_rows(self) -> dict[str, dict[int, tuple[Any, ...]]]:
        found: dict[str, dict[int, tuple[Any, ...]]] = {}
        for table, final in TABLES.items():
            if not self.held[table]:
                continue
            found[table] = {
                row[0]: tuple(row[1:])
                for row in self.db.rows(
                    f"SELECT id, {FENCED_COLUMNS} FROM {table} "
                    "WHERE id = ANY(%s) AND state = ANY(%s)",
                    self.held[table],
                    list(final),
                )
            }
        return found

    def _run(self) -> None:
        try:
            if self.error is None:
                self._watch()
        except Exception as exc:
            self.error = f"watch: {exc!r}"[:300]
        finally:
            self.db.close()

    def _watch(self) -> None:
        assert self.cut_at is not None
        # Taken over: polled while the host is cut off and after, until all finished.
        while self.clock() < self.cut_at + self.give_up:
            self._poll()
            if self.finished is not None:
                break
            time.sleep(0.2)
        self._reconnected.wait()
        # Fencing: what the others finished stays as they left it after the return.
        self.fenced = self._fence_rows()
        assert self.reconnected_at is not None
        pause = max(self.reconnected_at + self.fence_wait - self.clock(), 2.0)
        time.sleep(pause)
        after = self._fence_rows()
        for table, rows in self.fenced.items():
            for pk, before in rows.items():
                now = after.get(table, {}).get(pk)
                if now != before:
                    self.changed.append(f"{table} {pk}: {before} -> {now}")

    def report(self) -> dict[str, Any]:
        def since_cut(at: float | None) -> float | None:
            return None if at is None or self.cut_at is None else round(at - self.cut_at, 2)

        return {
            "host": self.host,
            "pids": self.pids,
            "workers": len(self.workers),
            "held at the cut": {
                t.removeprefix("django_outbox_"): len(v) for t, v in self.held.items()
            },
            "released after (s)": since_cut(self.released),
            "finished by others after (s)": since_cut(self.finished),
            "reconnected after (s)": since_cut(self.reconnected_at),
            "fenced rows compared": sum(len(rows) for rows in self.fenced.values()),
            "changed after the return": self.changed[:10],
            "error": self.error,
        }
