"""Declaring the starts of attempts on PostgreSQL without waiting for the database.

An attempt counts when its step starts, and a worker that dies during the step must
leave a durable trace of having started it (``engine.lease.declare``). Written with a
round trip per row, that trace would cost a short job most of its time; so on
PostgreSQL a live worker sends each declaration on a connection of its own, in libpq's
pipeline mode, and goes on without waiting for the answer:

- the statement (the worker row's ``attempt_token``/``attempt_ids``) is on its way to
  the server before the step starts, and the server commits it when it reads it, also
  if the worker dies meanwhile (the connection's ``synchronous_commit`` is off: a
  crash of the database server itself may lose the last declarations, which then
  look unstarted, and the rows run again uncounted);
- the answers are read later, a few at a time, never waited for on the hot path; an
  answer that says the lease is no longer this worker's (its row matched nothing)
  marks the lease as lost, and the step starts nothing more under it (at most the
  rows declared meanwhile ran without it; their outcomes are fenced out as ever).

The price: one more connection per worker process and thread, and about 15 µs of
Python per declaration.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from django.db import OperationalError, connections

logger = logging.getLogger("django_outbox.engine")


def connect_beside(using: str) -> Any:
    """A psycopg connection (autocommit) of its own to the PostgreSQL database that
    Django's *using* reaches, with the same parameters (for LISTEN, and for
    declarations that must not wait on Django's connection)."""
    import psycopg

    connection = connections[using]
    connection.ensure_connection()
    info = connection.connection.info
    return psycopg.connect(
        host=info.host,
        port=info.port,
        dbname=info.dbname,
        user=info.user,
        password=info.password or None,
        autocommit=True,
    )


class Pipeline:
    """A connection that sends declarations and reads their answers later."""

    def __init__(self, using: str) -> None:

        self.using = using
        self.conn = connect_beside(using)
        self.conn.execute("SET synchronous_commit = off")
        self.pg = self.conn.pgconn
        self.pg.enter_pipeline_mode()
        #: Leases whose declarations are in flight, oldest first (one per statement;
        #: ``None`` for a statement's preparation).
        self.in_flight: deque[uuid.UUID | None] = deque()
        #: Leases a declaration found no longer held.
        self.lost: set[uuid.UUID] = set()
        self._prepared: dict[str, bytes] = {}
        self._token: uuid.UUID | None = None
        self._token_bytes = b""
        self._worker: uuid.UUID | None = None
        self._worker_bytes = b""

    def declare(
        self,
        table: str,
        pk_column: str,
        ids: Sequence[Any],
        open_ids: str,
        token: uuid.UUID,
        worker: uuid.UUID,
        running_state: str,
    ) -> None:
        """Send the declaration that *worker* has started *open_ids* under *token*,
        fenced by the first of *ids* still being held under it; do not wait."""
        if len(self.in_flight) >= COLLECT_EVERY:
            self.collect()
        name = self._prepared.get(table)
        try:
            if name is None:
                name = self._prepare(table, pk_column)
            if token != self._token:
                self._token, self._token_bytes = token, str(token).encode()
            if worker != self._worker:
                self._worker, self._worker_bytes = worker, str(worker).encode()
            self.pg.send_query_prepared(
                name,
                [
                    self._token_bytes,
                    open_ids.encode(),
                    self._worker_bytes,
                    str(ids[0]).encode(),
                    running_state.encode(),
                ],
            )
            self.pg.pipeline_sync()
            self.pg.flush()
        except OperationalError:
            raise
        except Exception as exc:
            raise OperationalError(f"declaring attempts failed: {exc}") from exc
        self.in_flight.append(token)

    def _prepare(self, table: str, pk_column: str) -> bytes:
        """Prepare the declaration for *table* (answered like any statement in flight)."""
        name = f"django_outbox_declare_{len(self._prepared)}".encode()
        sql = (
            'UPDATE "django_outbox_worker" SET "attempt_token" = $1, '
            '"attempt_ids" = $2, "attempt_started_at" = STATEMENT_TIMESTAMP() '
            f'WHERE "id" = $3 AND EXISTS (SELECT 1 FROM "{table}" '
            f'WHERE "{pk_column}" = $4::bigint AND "lock_token" = $1 AND "state" = $5)'
        ).encode()
        self.pg.send_prepare(name, sql)
        self.pg.pipeline_sync()
        self.in_flight.append(None)
        self._prepared[table] = name
        return name

    def collect(self, *, wait: bool = False) -> None:
        """Read the answers that have come (all of them, with *wait*)."""
        from psycopg import pq

        pg = self.pg
        try:
            while self.in_flight:
                pg.consume_input()
                if pg.is_busy():
                    if not wait:
                        return
                    select.select([pg.socket], [], [], 1.0)
                    continue
                result = pg.get_result()
                if result is None:
                    continue
                status = result.status
                if status == pq.ExecStatus.PIPELINE_SYNC:
                    self.in_flight.popleft()
                elif status == pq.ExecStatus.COMMAND_OK:
                    token = self.in_flight[0]
                    if token is not None and (result.command_tuples or 0) == 0:
                        self.lost.add(token)
                else:
                    message = (result.error_message or b"").decode(errors="replace")
                    raise OperationalError(f"declaring attempts failed: {message.strip()}")
        except OperationalError:
            raise
        except Exception as exc:
            raise OperationalError(f"declaring attempts failed: {exc}") from exc

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # pragma: no cover - closing a broken connection
            logger.debug("closing the declarations' connection failed", exc_info=True)


#: Answers are read once this many declarations are in flight (or when asked).
COLLECT_EVERY = 32

_local = threading.local()


def pipeline(using: str) -> Pipeline:
    """This thread's declarations pipeline to database *using* (made on first use, again
    after a fork or a failure)."""
    pipes: dict[tuple[int, str], Pipeline] = _local.__dict__.setdefault("pipes", {})
    key = (os.getpid(), using)
    pipe = pipes.get(key)
    if pipe is None:
        try:
            pipe = pipes[key] = Pipeline(using)
        except Exception as exc:
            raise OperationalError(f"cannot open the declarations' connection: {exc}") from exc
    return pipe


def forget(using: str) -> None:
    """Drop this thread's pipeline to *using* (after a failure: the next use reconnects)."""
    pipes: dict[tuple[int, str], Pipeline] = _local.__dict__.setdefault("pipes", {})
    pipe = pipes.pop((os.getpid(), using), None)
    if pipe is not None:
        pipe.close()


def forget_all() -> None:
    """Close this thread's pipelines (a worker stops: its declarations are answered or
    moot)."""
    pipes: dict[tuple[int, str], Pipeline] = _local.__dict__.setdefault("pipes", {})
    for pipe in pipes.values():
        pipe.close()
    pipes.clear()
