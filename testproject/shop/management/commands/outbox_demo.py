"""The demo: orders and their messages survive a worker killed with SIGKILL, and on the
other side each order is invoiced exactly once despite duplicates and another kill; then
a batch of jobs survives a third. It ends by pointing to the admin."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone
from kombu import Connection

import django_outbox
from django_outbox.models import InboxMessage, InboxState, OutboxMessage, OutboxState
from testproject.shop.models import Order, Payment
from testproject.shop.services import place_order

ROOT = Path(settings.BASE_DIR)


class Command(BaseCommand):
    help = (
        "Place orders, kill the Celery worker mid-way, watch the sweep recover: lost = 0; "
        "then deliver every order twice to the inbox, kill the worker when some but not all "
        "are handled: each order invoiced once; then run a receipt job per order as one "
        "batch, kill the worker mid-batch: each receipt once, the batch's callback enqueued "
        "once. Ends with how to open the admin on what it left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--orders", type=int, default=300)
        parser.add_argument("--timeout", type=float, default=180.0)

    def handle(self, *args: Any, **options: Any) -> None:
        self.destination = settings.DJANGO_OUTBOX["OUTBOX"]["DESTINATIONS"]["default"]
        self.say(
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
            f"Celery broker: {settings.CELERY_BROKER_URL}, "
            f"outbox destination: {self.destination['URL']} queue {self.destination['QUEUE']}"
        )
        self.reset()
        worker = self.start_worker("worker-1", beat=False)

        orders = options["orders"]
        self.say(f"placing {orders} orders, each committed together with its order.created")
        rng = random.Random(42)
        for n in range(orders):
            place_order(f"customer-{n % 25}", rng.randint(100, 10_000))
        declined = 0
        for n in range(3):
            try:
                with transaction.atomic():
                    order = Order.objects.create(customer=f"declined-{n}", total_cents=1)
                    django_outbox.send("order.created", {"order_id": order.pk}, key="declined")
                    raise RuntimeError("card declined")
            except RuntimeError:
                declined += 1
        self.say(f"{declined} orders rolled back (card declined): their messages vanish with them")

        self.wait(lambda: self.count(OutboxState.SENT) >= orders // 3, options["timeout"])
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        self.say(f"SIGKILL worker-1 mid-delivery → {self.states()}")

        self.say("starting worker-2 with Celery beat: the sweep rescues expired leases")
        worker = self.start_worker("worker-2", beat=True)
        try:
            self.wait(lambda: self.count(OutboxState.SENT) == orders, options["timeout"])
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        self.report(orders, declined)
        self.other_side(orders, options["timeout"])
        self.jobs_side(orders, options["timeout"])
        self.point_to_the_admin()

    # -- the other side: this project's inbox as a second service ------------

    def other_side(self, orders: int, timeout: float) -> None:
        """Billing, the receiving service: every order's invoice.requested is delivered
        twice on purpose, the handling worker is killed when some but not all are
        handled, and a second worker finishes: each order is invoiced exactly once."""
        from django_outbox.outbox.relay import Relay

        self.stdout.write("")
        self.say(
            "the other side: billing's inbox receives invoice.requested for every order "
            "(through the local transport), each delivered twice on purpose"
        )
        for order in Order.objects.order_by("pk"):
            with transaction.atomic():
                django_outbox.send(
                    "invoice.requested", {"order_id": order.pk}, to="billing", key="billing"
                )
        # This process relays them (no worker runs yet): all are stored before any is
        # handled, so the kill below lands mid-stream, whatever the machine's speed.
        mine = OutboxMessage.objects.filter(type="invoice.requested")
        Relay().drain()
        # Deliver every invoice.requested a second time: a sender that retried.
        mine.update(state=OutboxState.SHOULD_BE_SENT, available_at=timezone.now())
        Relay().drain()
        stored = InboxMessage.objects.filter(source="shop").count()
        self.say(
            f"relayed twice: {sum(mine.values_list('attempts', flat=True))} deliveries, "
            f"{stored} stored in billing's inbox, none handled yet"
        )
        # The demo slows the handler (20 ms a message) so that handling takes seconds.
        worker = self.start_worker("worker-3", beat=False, handler_delay=0.02)
        self.wait(lambda: self.invoiced() >= orders // 3, timeout, self.inbox_states)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        at_kill = self.invoiced()
        self.say(
            f"SIGKILL worker-3 mid-handling: {at_kill} of {orders} invoiced; the batch it "
            "was handling rolled back with its connection, invoices included"
        )
        if at_kill >= orders:
            self.say("  (the kill came after the last message: this machine was fast)")
        self.say("starting worker-4 with Celery beat: it handles the rest")
        worker = self.start_worker("worker-4", beat=True)
        try:
            self.wait(
                lambda: (
                    self.invoiced() == orders
                    and not InboxMessage.objects.exclude(state=InboxState.HANDLED).exists()
                ),
                timeout,
                self.inbox_states,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        deliveries = sum(mine.values_list("attempts", flat=True))
        invoices = self.invoiced()
        per_order = Counter(Payment.objects.filter(status="invoiced").values_list("order_ref"))
        rows = [
            ("invoice.requested deliveries (2 each)", deliveries),
            ("stored in billing's inbox (unique)", stored),
            ("duplicates suppressed", deliveries - stored),
            ("invoiced before the kill (worker-3)", at_kill),
            ("invoiced after the kill (worker-4)", invoices - at_kill),
            ("handled", InboxMessage.objects.filter(state=InboxState.HANDLED).count()),
            ("invoices (effects)", invoices),
            ("orders invoiced twice", sum(1 for n in per_order.values() if n > 1)),
        ]
        self.stdout.write("")
        for label, value in rows:
            self.stdout.write(f"  {label:<44} {value:>6}")
        self.stdout.write("")
        if invoices == orders == stored and not any(n > 1 for n in per_order.values()):
            self.stdout.write(self.style.SUCCESS("every order was invoiced exactly once"))
        else:
            self.stdout.write(self.style.ERROR("demo failed: an order was not invoiced once"))
            raise SystemExit(1)

    # -- background jobs: receipts, on the same engine --------------------------

    def jobs_side(self, orders: int, timeout: float) -> None:
        """A receipt job per order, enqueued through Django's Tasks API as one batch; the
        worker running them is killed mid-way; every receipt is written once and the
        batch's callback runs once."""
        from django_outbox.jobs import batch
        from django_outbox.jobs.models import Job, JobBatch, JobState
        from testproject.shop import jobs

        self.stdout.write("")
        self.say(
            "background jobs: a receipt job per order (django.tasks on our backend), "
            "enqueued as one batch with a callback"
        )
        rolled_back = 0
        for n in range(3):
            try:
                with transaction.atomic():
                    order = Order.objects.create(customer=f"refunded-{n}", total_cents=1)
                    jobs.send_receipt.enqueue(order.pk)
                    raise RuntimeError("refunded at once")
            except RuntimeError:
                rolled_back += 1
        with batch(on_finish=jobs.receipts_done):
            for order_id in Order.objects.order_by("pk").values_list("pk", flat=True):
                jobs.send_receipt.enqueue(order_id)
        self.say(f"{orders} receipt jobs committed; {rolled_back} enqueued in rolled-back orders")
        worker = self.start_worker("worker-5", beat=False, job_delay=0.01)
        done = Job.objects.filter(task_path__endswith="send_receipt", state=JobState.SUCCESSFUL)

        def job_states() -> str:
            counts = Counter(mine.values_list("state", flat=True))
            return "jobs " + ", ".join(f"{s}: {counts.get(s, 0)}" for s in JobState.values)

        mine = Job.objects.filter(task_path__endswith="send_receipt")
        self.wait(lambda: done.count() >= orders // 3, timeout, job_states)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        self.say(f"SIGKILL worker-5 mid-batch → {done.count()} of {orders} receipts done")
        worker = self.start_worker("worker-6", beat=True)
        try:
            self.wait(
                lambda: Payment.objects.filter(order_ref="receipts-batch").exists(),
                timeout,
                job_states,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        receipts = Payment.objects.filter(status="receipt")
        callbacks = list(
            Payment.objects.filter(order_ref="receipts-batch").values_list("status", flat=True)
        )
        rows = [
            ("receipt jobs enqueued (committed)", mine.count()),
            ("receipt jobs of rolled-back orders", rolled_back),
            ("SUCCESSFUL", mine.filter(state=JobState.SUCCESSFUL).count()),
            ("run again after the kill (attempts > 1)", mine.filter(attempts__gt=1).count()),
            ("receipts written (idempotent job)", receipts.count()),
            ("batch callbacks", len(callbacks)),
        ]
        self.stdout.write("")
        for label, value in rows:
            self.stdout.write(f"  {label:<44} {value:>6}")
        self.stdout.write(f"  {'batch callback saw (ok/failed/total)':<44} {callbacks[0]:>6}")
        self.stdout.write("")
        batch_row = JobBatch.objects.get()
        if (
            receipts.count() == orders == mine.count()
            and callbacks == [f"{orders}/0/{orders}"]
            and batch_row.finished_at is not None
        ):
            self.stdout.write(
                self.style.SUCCESS(
                    "every order got its receipt once; the batch callback was enqueued once "
                    "(and ran once)"
                )
            )
        else:
            self.stdout.write(self.style.ERROR("demo failed: receipts or callback not once"))
            raise SystemExit(1)

    def point_to_the_admin(self) -> None:
        """How to look at what the demo left: every message, inbox row and job, with its
        attempts, errors and history, in the admin."""

        def short(path: str) -> str:
            return os.path.relpath(path) if path.startswith(os.getcwd()) else path

        command = f"{short(sys.executable)} {short(str(ROOT / 'manage.py'))}"
        # The same database as the demo's: the variables that chose it, if any.
        env = "".join(
            f"{name}={shlex.quote(os.environ[name])} "
            for name in ("DATABASE_URL", "TESTPROJECT_VAR_DIR")
            if os.environ.get(name)
        )
        self.stdout.write("")
        self.stdout.write("The messages, inbox rows and jobs of this run are in the admin:")
        self.stdout.write(f"  {env}{command} createsuperuser")
        self.stdout.write(f"  {env}{command} runserver")
        self.stdout.write("  then open http://127.0.0.1:8000/admin/django_outbox/")

    def invoiced(self) -> int:
        return Payment.objects.filter(status="invoiced").count()

    def inbox_states(self) -> str:
        counts = Counter(InboxMessage.objects.values_list("state", flat=True))
        return ", ".join(f"{state}: {counts.get(state, 0)}" for state in InboxState.values)

    # -- steps ---------------------------------------------------------------

    def reset(self) -> None:
        from django_outbox.jobs.models import Job, JobBatch

        Job.objects.all().delete()
        JobBatch.objects.all().delete()
        OutboxMessage.objects.all().delete()
        InboxMessage.objects.all().delete()
        Payment.objects.all().delete()
        Order.objects.all().delete()
        self.read_broker()  # empty the destination queue
        schedule = Path(settings.VAR_DIR) / "celerybeat-schedule"
        for stale in Path(settings.VAR_DIR).glob("celerybeat-schedule*"):
            stale.unlink()
        self.schedule = schedule
        with Connection(settings.CELERY_BROKER_URL, transport_options=self.broker_options()) as c:
            c.SimpleQueue("celery").clear()

    def broker_options(self) -> dict[str, Any]:
        return dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {})

    def start_worker(
        self, name: str, *, beat: bool, handler_delay: float = 0.0, job_delay: float = 0.0
    ) -> subprocess.Popen[bytes]:
        outbox = json.loads(json.dumps(settings.DJANGO_OUTBOX))
        outbox["OUTBOX"]["DESTINATIONS"]["default"] = {
            **self.destination,
            # Slow each publish a little so the kill lands mid-way.
            "TRANSPORT": "testproject.transports.SlowKombuTransport",
            "DELAY": 0.01,
        }
        outbox.update(BATCH_SIZE=20, LEASE_SECONDS=3)
        env = {
            **os.environ,
            "OUTBOX_SETTINGS_JSON": json.dumps(outbox),
            "TESTPROJECT_SWEEP_SECONDS": "1",
            "TESTPROJECT_HANDLER_DELAY": str(handler_delay),
            "TESTPROJECT_JOB_DELAY": str(job_delay),
        }
        command = [sys.executable, "-m", "celery", "-A", "testproject", "worker"]
        command += ["--pool=solo", "-n", f"{name}@%h", "-l", "ERROR", "--without-mingle"]
        command += ["--without-gossip", "--without-heartbeat"]
        if beat:
            command += ["--beat", "--schedule", str(self.schedule)]
        log = Path(settings.VAR_DIR) / f"demo-{name}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
            )
        self.say(f"started Celery {name} (pid {process.pid}, log {log})")
        return process

    def read_broker(self) -> list[str]:
        ids = []
        options = self.destination.get("TRANSPORT_OPTIONS") or {}
        with Connection(self.destination["URL"], transport_options=options) as connection:
            queue = connection.SimpleQueue(self.destination["QUEUE"])
            while True:
                try:
                    message = queue.get(timeout=0.5)
                except queue.Empty:
                    break
                ids.append(message.headers["outbox-message-id"])
                message.ack()
            queue.close()
        return ids

    def report(self, orders: int, declined: int) -> None:
        at_broker = Counter(self.read_broker())
        committed = {
            str(m): o
            for m, o in OutboxMessage.objects.values_list("message_id", "payload__order_id")
        }
        lost = [m for m in committed if m not in at_broker]
        duplicates = sum(n - 1 for n in at_broker.values())
        resent = OutboxMessage.objects.filter(last_error__contains="outcome uncertain").count()
        retried = OutboxMessage.objects.filter(attempts__gt=1).count()
        phantom = [m for m in at_broker if m not in committed]
        rows = [
            ("orders committed", Order.objects.count()),
            ("orders rolled back", declined),
            ("messages sent", self.count(OutboxState.SENT)),
            ("messages at the broker (unique)", len(at_broker)),
            ("resent after the crash (uncertain)", resent),
            ("retried (attempts > 1)", retried),
            ("duplicates at the broker (at-least-once)", duplicates),
            ("messages of rolled-back orders published", len(phantom)),
            ("lost", len(lost)),
        ]
        self.stdout.write("")
        for label, value in rows:
            self.stdout.write(f"  {label:<44} {value:>6}")
        ok = not lost and not phantom and len(at_broker) == orders
        self.stdout.write("")
        self.stdout.write(
            "  'resent after the crash' counts the messages the killed worker held in "
            "'sending': nobody can know whether they reached the broker before the kill, so "
            "they were published again; 'duplicates' counts those that really arrived twice "
            "(0 when the kill landed before their publish). Consumers deduplicate on "
            "outbox-message-id."
        )
        self.stdout.write("")
        if ok:
            self.stdout.write(self.style.SUCCESS("every committed order's message was delivered"))
        else:
            self.stdout.write(self.style.ERROR("demo failed: messages were lost or leaked"))
            raise SystemExit(1)

    # -- helpers -------------------------------------------------------------

    def count(self, state: str) -> int:
        return OutboxMessage.objects.filter(state=state).count()

    def states(self) -> str:
        counts = Counter(OutboxMessage.objects.values_list("state", flat=True))
        return ", ".join(f"{state}: {counts.get(state, 0)}" for state in OutboxState.values)

    def wait(self, condition: Any, timeout: float, progress: Any = None) -> None:
        progress = progress or self.states
        deadline = time.monotonic() + timeout
        last = ""
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"demo timed out; {progress()}")
            states = progress()
            if states != last:
                self.say(f"  … {states}")
                last = states
            time.sleep(0.3)

    def say(self, text: str) -> None:
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {text}")
