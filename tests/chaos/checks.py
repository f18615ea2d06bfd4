"""The invariants, read from both services' databases after the run (plain SQL: the
harness runs no Django of its own, it has two databases).

Each check returns figures for the report and a list of failures (empty: it holds).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import psycopg

from tests.chaos.workload import ROUTES, Plan

FINAL_JOB_STATES = ("SUCCESSFUL", "FAILED")
CHAOS_TYPES = ("chaos.order", "chaos.step", "chaos.status", "chaos.quote")


def _rows(db: psycopg.Connection[Any], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return db.execute(sql, params).fetchall()


def _one(db: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = db.execute(sql, params).fetchone()
    return row[0] if row else None


def progress(a: psycopg.Connection[Any], b: psycopg.Connection[Any], plan: Plan) -> dict[str, int]:
    """What is still to do (all zero: drained)."""
    units = len(plan.units())
    quotes = _one(a, "SELECT count(*) FROM django_outbox_message WHERE type = 'chaos.quote'")
    return {
        "units not committed": units
        - _one(a, "SELECT count(*) FROM shop_order WHERE customer LIKE 'chaos-%%'"),
        "A outbox not sent": _one(
            a, "SELECT count(*) FROM django_outbox_message WHERE state <> 'sent'"
        ),
        "B inbox missing": _one(a, "SELECT count(*) FROM django_outbox_message")
        - _one(b, "SELECT count(*) FROM django_outbox_inbox WHERE source = ANY(%s)", list(ROUTES)),
        "B inbox not final": _one(
            b,
            "SELECT count(*) FROM django_outbox_inbox WHERE state NOT IN ('handled', 'skipped')",
        ),
        "B outbox not sent": _one(
            b, "SELECT count(*) FROM django_outbox_message WHERE state <> 'sent'"
        ),
        "A replies missing": quotes
        - _one(a, "SELECT count(*) FROM django_outbox_inbox WHERE type = 'chaos.quote.reply'"),
        "A inbox not final": _one(
            a,
            "SELECT count(*) FROM django_outbox_inbox WHERE state NOT IN ('handled', 'skipped')",
        ),
        "A jobs missing": plan.expected_jobs_a()
        - _one(a, "SELECT count(*) FROM django_outbox_job WHERE task_path LIKE '%%chaos_%%'"),
        "A jobs not final": _one(
            a,
            "SELECT count(*) FROM django_outbox_job WHERE state <> ALL(%s)",
            list(FINAL_JOB_STATES),
        ),
        "B jobs missing": plan.expected_jobs_b()
        - _one(b, "SELECT count(*) FROM django_outbox_job WHERE task_path LIKE '%%chaos_%%'"),
        "B jobs not final": _one(
            b,
            "SELECT count(*) FROM django_outbox_job WHERE state <> ALL(%s)",
            list(FINAL_JOB_STATES),
        ),
    }


def _effects(db: psycopg.Connection[Any], status_like: str) -> Counter[str]:
    return Counter(
        ref
        for (ref,) in _rows(
            db, "SELECT order_ref FROM shop_payment WHERE status LIKE %s", status_like
        )
    )


#: The effect rows of B's message handlers (testproject.shop.handlers).
MESSAGE_EFFECTS = ("chaos", "chaos-strict", "chaos-latest", "chaos-quote")


def messages(
    a: psycopg.Connection[Any], b: psycopg.Connection[Any], failures: list[str]
) -> dict[str, Any]:
    """Every intent of A delivered to B and handled there, each effect exactly once,
    strict keys in order, latest keys at their newest, every request answered once."""
    sent = {
        str(mid): (type_, dest, key, seq, state)
        for mid, type_, dest, key, seq, state in _rows(
            a,
            "SELECT message_id, type, destination, key, sequence, state FROM django_outbox_message",
        )
    }
    received = {
        (source, mid): (state, key, seq)
        for source, mid, state, key, seq in _rows(
            b, "SELECT source, message_id, state, key, sequence FROM django_outbox_inbox"
        )
    }
    effects = Counter(
        ref
        for (ref,) in _rows(
            b, "SELECT order_ref FROM shop_payment WHERE status = ANY(%s)", list(MESSAGE_EFFECTS)
        )
    )
    figures: dict[str, Any] = {
        "intents": len(sent),
        "by type": dict(Counter(t for t, *_ in sent.values())),
        "by destination": dict(Counter(d for _, d, *_ in sent.values())),
    }
    lost = [m for m, (_, dest, *_r) in sent.items() if (dest, m) not in received]
    not_sent = [m for m, v in sent.items() if v[4] != "sent"]
    doubled: list[str] = []
    missing_effect: list[str] = []
    wrong_state: list[str] = []
    for mid, (type_, dest, _key, _seq, _state) in sent.items():
        if (dest, mid) not in received:
            continue
        state = received[(dest, mid)][0]
        allowed = ("handled", "skipped") if type_ == "chaos.status" else ("handled",)
        if state not in allowed:
            wrong_state.append(f"{mid} {type_} {state}")
            continue
        count = effects.get(mid, 0)
        if count > 1:
            doubled.append(f"{mid} {type_} x{count}")
        if state == "handled" and count == 0:
            missing_effect.append(f"{mid} {type_}")
        if state == "skipped" and count:
            doubled.append(f"{mid} {type_} skipped but has {count} effect(s)")
    foreign = [ref for ref in effects if ref not in sent]
    figures.update(
        lost=len(lost),
        not_sent=len(not_sent),
        not_handled=len(wrong_state),
        duplicated_effects=len(doubled),
        missing_effects=len(missing_effect),
        skipped_stale=sum(1 for v in received.values() if v[0] == "skipped"),
    )
    for what, items in (
        ("lost (committed, never stored by B)", lost),
        ("not sent by A", not_sent),
        ("not handled by B", wrong_state),
        ("effect more than once", doubled),
        ("handled without its effect", missing_effect),
        ("effects of no intent", foreign),
    ):
        if items:
            failures.append(f"messages {what}: {len(items)}, e.g. {items[:5]}")

    # Strict keys: the effects' order (their ids) is the keys' sequence order, 1..n.
    strict: dict[str, list[int]] = defaultdict(list)
    for key, seq in _rows(
        b,
        "SELECT i.key, p.sequence FROM shop_payment p JOIN django_outbox_inbox i "
        "ON i.message_id = p.order_ref WHERE p.status = 'chaos-strict' ORDER BY p.id",
    ):
        strict[key].append(seq)
    expected_n = Counter(k for t, _d, k, *_ in sent.values() if t == "chaos.step")
    out_of_order = [
        f"{key}: {seqs[:20]}"
        for key, seqs in strict.items()
        if seqs != list(range(1, expected_n[key] + 1))
    ]
    figures["strict keys"] = {"keys": len(expected_n), "messages": sum(expected_n.values())}
    if out_of_order:
        failures.append(f"strict keys out of order or incomplete: {out_of_order[:5]}")

    # Latest keys: each ends at its newest sequence.
    newest: dict[str, int] = {}
    for _t, _d, key, seq, _s in (v for v in sent.values() if v[0] == "chaos.status"):
        newest[key] = max(newest.get(key, 0), seq)
    kept = dict(
        _rows(
            b,
            "SELECT substr(order_ref, 7), sequence FROM shop_orderstatus "
            "WHERE order_ref LIKE 'chaos:%%'",
        )
    )
    behind = [f"{k}: {kept.get(k)} < {n}" for k, n in newest.items() if kept.get(k) != n]
    figures["latest keys"] = {"keys": len(newest), "behind": len(behind)}
    if behind:
        failures.append(f"latest keys not at their newest: {behind[:5]}")

    # Request and reply: B sent one reply per request, A handled it once.
    requests = [m for m, v in sent.items() if v[0] == "chaos.quote"]
    replies_sent = Counter(
        c
        for (c,) in _rows(
            b,
            "SELECT correlation_id FROM django_outbox_message "
            "WHERE type = 'chaos.quote.reply' AND state = 'sent'",
        )
    )
    replies_handled = Counter(
        c
        for (c,) in _rows(
            a,
            "SELECT correlation_id FROM django_outbox_inbox "
            "WHERE type = 'chaos.quote.reply' AND state = 'handled'",
        )
    )
    reply_effects = _effects(a, "chaos-reply")
    unanswered = [m for m in requests if replies_sent.get(m) != 1 or replies_handled.get(m) != 1]
    reply_doubled = [m for m in requests if reply_effects.get(m, 0) != 1]
    figures["requests"] = {
        "sent": len(requests),
        "replies handled": sum(replies_handled.values()),
        "reply effects": sum(reply_effects.values()),
    }
    if unanswered:
        failures.append(f"requests without exactly one reply: {len(unanswered)}: {unanswered[:5]}")
    if reply_doubled:
        failures.append(f"reply effects not exactly once: {len(reply_doubled)}")
    return figures


def jobs(
    db: psycopg.Connection[Any], side: str, expected: int, failures: list[str]
) -> dict[str, Any]:
    """Every job ran (at least once; more only after a lost worker), serial keys in
    order, every batch's callback ran."""
    rows = _rows(
        db,
        "SELECT result_id, task_path, state, attempts, errors, serial_key, sequence "
        "FROM django_outbox_job WHERE task_path LIKE '%%chaos_%%'",
    )
    runs = _effects(db, "chaos-%%")
    figures: dict[str, Any] = {"jobs": len(rows), "expected": expected}
    not_run, failed, reruns, unexplained = [], [], [], []
    for result_id, path, state, attempts, errors, _skey, _seq in rows:
        count = runs.get(str(result_id), 0)
        if state != "SUCCESSFUL":
            failed.append(f"{result_id} {path} {state} after {attempts} attempt(s)")
        if count == 0:
            not_run.append(f"{result_id} {path}")
        elif count > 1:
            lost = sum(
                1
                for error in errors or []
                if "WorkerLost" in str(error.get("exception_class_path", ""))
            )
            (reruns if lost else unexplained).append(f"{result_id} {path} ran {count}x")
    figures.update(
        failed=len(failed),
        never_ran=len(not_run),
        rerun_after_lost_worker=len(reruns),
        rerun_unexplained=len(unexplained),
        retried=sum(1 for r in rows if r[3] > 1),
    )
    if reruns:
        figures["reruns"] = reruns[:20]
    if len(rows) != expected:
        failures.append(f"{side} jobs: {len(rows)} stored, {expected} enqueued")
    for what, items in (
        ("not SUCCESSFUL", failed),
        ("never ran", not_run),
        ("ran again with no lost worker", unexplained),
    ):
        if items:
            failures.append(f"{side} jobs {what}: {len(items)}, e.g. {items[:5]}")

    # Serial keys: the first runs come in the keys' sequence order.
    first: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for ref, key, seq in _rows(
        db,
        "SELECT p.order_ref, j.serial_key, j.sequence FROM shop_payment p "
        "JOIN django_outbox_job j ON j.result_id::text = p.order_ref "
        "WHERE p.status = 'chaos-serial' ORDER BY p.id",
    ):
        if ref not in seen:
            seen.add(ref)
            first[key].append(seq)
    disordered = [k for k, seqs in first.items() if seqs != sorted(seqs)]
    figures["serial keys"] = len(first)
    if disordered:
        failures.append(f"{side} serial keys run out of order: {disordered}")
    batches = _rows(
        db,
        "SELECT batch_id, finished_at IS NOT NULL, succeeded, total FROM django_outbox_job_batch",
    )
    unfinished = [str(b) for b, done, ok, total in batches if not done or ok != total]
    figures["batches"] = len(batches)
    if unfinished:
        failures.append(f"{side} batches not finished with every job successful: {unfinished[:5]}")
    return figures


def leases(db: psycopg.Connection[Any], side: str, failures: list[str]) -> dict[str, int]:
    """No row still claimed under a lease that has run out."""
    found = {}
    for table in ("django_outbox_message", "django_outbox_inbox", "django_outbox_job"):
        found[table] = _one(
            db,
            f"SELECT count(*) FROM {table} "  # our own table names
            "WHERE lock_token IS NOT NULL AND locked_until < now()",
        )
        if found[table]:
            failures.append(f"{side} {table}: {found[table]} row(s) claimed under an expired lease")
    return found


def duplicates(
    b: psycopg.Connection[Any], published: dict[str, list[str]], failures: list[str]
) -> dict[str, Any]:
    """Each message published again at a broker (or posted again to the webhook) left
    exactly one inbox row in B and at most one effect (none only when skipped as stale):
    the duplicates were suppressed. Counted from B's database, not from the consumers'
    words."""
    ids = sorted({mid for route_ids in published.values() for mid in route_ids})
    rows = Counter(
        (source, mid)
        for source, mid in _rows(
            b,
            "SELECT source, message_id FROM django_outbox_inbox WHERE message_id = ANY(%s)",
            ids,
        )
    )
    states = dict(
        _rows(
            b, "SELECT message_id, state FROM django_outbox_inbox WHERE message_id = ANY(%s)", ids
        )
    )
    effects = Counter(
        ref
        for (ref,) in _rows(
            b,
            "SELECT order_ref FROM shop_payment WHERE order_ref = ANY(%s) AND status = ANY(%s)",
            ids,
            list(MESSAGE_EFFECTS),
        )
    )
    bad: list[str] = []
    for route, route_ids in published.items():
        for mid in route_ids:
            if rows.get((route, mid)) != 1:
                bad.append(f"{route} {mid}: {rows.get((route, mid), 0)} inbox row(s)")
            expected = 0 if states.get(mid) == "skipped" else 1
            if effects.get(mid, 0) != expected:
                bad.append(f"{route} {mid}: {effects.get(mid, 0)} effect(s), {states.get(mid)}")
    figures: dict[str, Any] = {
        "published again": {route: len(v) for route, v in published.items()},
        "suppressed (one row, one effect each)": sum(len(v) for v in published.values()) - len(bad),
    }
    if bad:
        failures.append(f"duplicates not suppressed: {len(bad)}, e.g. {bad[:5]}")
    return figures
