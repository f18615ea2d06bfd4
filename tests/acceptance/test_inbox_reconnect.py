"""``inbox_consume`` when its broker goes away, with a real process and a real RabbitMQ
behind a TCP proxy the test cuts (or, once, RabbitMQ itself restarted): it rides out
a short outage, every message published before, during and after it is stored and
handled once; a source that cannot come back ends the whole process, non-zero, with
one clear line."""

import json
import os
import signal
import threading
import time

import pytest
from kombu import Connection

from django_outbox.models import InboxMessage, InboxState
from testproject.shop.models import Payment
from tests import services
from tests.acceptance.helpers import wait_for
from tests.conftest import spawn_manage, subprocess_env
from tests.proxy import TcpProxy

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.rabbitmq,
    pytest.mark.processes,
]

RABBITMQ = services.SERVICES["rabbitmq"]


@pytest.fixture
def proxy():
    """A TCP proxy in front of RabbitMQ, up; taken down afterwards."""
    services.require("rabbitmq")
    proxy = TcpProxy(RABBITMQ)
    proxy.up()
    yield proxy
    proxy.down()


def through(proxy, url):
    """*url* with RabbitMQ's address replaced by the proxy's."""
    return url.replace("127.0.0.1:5672", f"127.0.0.1:{proxy.port}")


def declare(url, *queues):
    with Connection(url) as connection:
        for queue in queues:
            connection.SimpleQueue(queue).close()


def publish(url, queue, ids, message_type="payment.captured"):
    """Publish one message per id, straight to RabbitMQ (never through the proxy)."""
    with Connection(url) as connection:
        producer = connection.Producer()
        for message_id in ids:
            producer.publish(
                {"order": message_id, "order_id": message_id},
                routing_key=queue,
                serializer="json",
                headers={"outbox-message-id": message_id, "outbox-type": message_type},
            )


def ready_in_queue(url, queue):
    """Messages waiting in *queue*, not delivered to a consumer."""
    with Connection(url) as connection:
        return connection.default_channel.queue_declare(queue, passive=True).message_count


class Consumer:
    """An ``inbox_consume`` process whose output is read as it comes."""

    def __init__(self, *args, **env):
        self.process = spawn_manage(
            "inbox_consume", "--json", *args, env=subprocess_env(OUTBOX_LOG_LEVEL="INFO", **env)
        )
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def alive(self):
        return self.process.poll() is None

    def said(self, text):
        return [line for line in self.lines if text in line]

    def output(self):
        return "\n".join(self.lines)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.alive():
            os.kill(self.process.pid, sig)
        self.process.wait(timeout=timeout)
        self.reader.join(timeout=timeout)
        return self.process.returncode

    def exit_code(self, timeout):
        """Wait up to *timeout* seconds for the process to exit by itself."""
        try:
            wait_for(lambda: not self.alive(), timeout=timeout, what="inbox_consume to exit")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it said:\n{self.output()[-3000:]}") from None
        self.reader.join(timeout=10)
        return self.process.returncode


def handled(prefix):
    return InboxMessage.objects.filter(
        state=InboxState.HANDLED, message_id__startswith=prefix
    ).count()


def wait_handled(consumer, prefix, count, timeout=60):
    try:
        wait_for(lambda: handled(prefix) == count, timeout=timeout, what=f"{count} {prefix}*")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; inbox_consume said:\n{consumer.output()[-3000:]}") from None


def test_a_consumer_rides_out_a_broker_outage_and_handles_every_message_once(
    configure_outbox, amqp_url, queue_name, proxy
):
    url = through(proxy, amqp_url)
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name}}}
    )
    declare(amqp_url, queue_name)
    # Each invoice takes 0.2 s to handle: a batch of 10 is in hand for 2 s.
    consumer = Consumer("--batch", "10", "--max-outage", "60", TESTPROJECT_HANDLER_DELAY="0.2")
    try:
        before = [f"before-{n}" for n in range(10)]
        publish(amqp_url, queue_name, before, "invoice.requested")
        # The batch is delivered (none left in the queue) and not yet committed: cut.
        wait_for(lambda: ready_in_queue(amqp_url, queue_name) == 0, timeout=30, what="delivery")
        assert handled("before-") == 0
        proxy.down()
        during = [f"during-{n}" for n in range(10)]
        publish(amqp_url, queue_name, during, "invoice.requested")
        # The batch in hand commits (the database is reachable), its acks are lost.
        wait_handled(consumer, "before-", 10)
        time.sleep(2)  # a few tries to reconnect, refused
        assert consumer.alive(), consumer.output()
        proxy.up()
        wait_handled(consumer, "during-", 10)
        after = [f"after-{n}" for n in range(10)]
        publish(amqp_url, queue_name, after, "invoice.requested")
        wait_handled(consumer, "after-", 10)
        assert consumer.alive()
    finally:
        code = consumer.stop()
    output = consumer.output()
    assert code == 0, output
    assert InboxMessage.objects.count() == 30
    assert Payment.objects.filter(status="invoiced").count() == 30  # each effect once
    counts = json.loads(consumer.lines[-1])
    # The batch in hand when the connection went came again, and was recognised.
    assert counts["duplicates"] >= 10, counts
    # One line when the outage began, one when it ended: not one per try.
    assert len(consumer.said("WARNING")) == 1, output
    [lost] = consumer.said("WARNING")
    assert "inbox source 'shop'" in lost and f"127.0.0.1:{proxy.port}" in lost
    assert "guest:guest" not in output  # the password is masked
    assert len(consumer.said("connected to")) == 1, output
    assert "Traceback" not in output


def test_a_silent_connection_is_found_by_heartbeats_and_made_again(
    configure_outbox, amqp_url, queue_name, proxy
):
    """A link that stays open but carries nothing back (a NAT or load balancer that
    dropped the connection without a reset) is noticed after two missed heartbeats."""
    url = through(proxy, amqp_url)
    configure_outbox(
        INBOX={
            "SOURCES": {
                "shop": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name, "HEARTBEAT": 1}
            }
        }
    )
    declare(amqp_url, queue_name)
    consumer = Consumer("--max-outage", "60")
    try:
        publish(amqp_url, queue_name, ["before-1"])
        wait_handled(consumer, "before-", 1)
        proxy.mode = "swallow_replies"  # requests still go through; nothing comes back
        try:
            wait_for(lambda: consumer.said("WARNING"), timeout=30, what="the silence noticed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it said:\n{consumer.output()[-3000:]}") from None
        proxy.down()  # the silent connections end with the episode
        proxy.mode = "forward"
        proxy.up()
        publish(amqp_url, queue_name, ["after-1"])
        wait_handled(consumer, "after-", 1)
        assert consumer.alive()
    finally:
        code = consumer.stop()
    output = consumer.output()
    assert code == 0, output
    [silent] = consumer.said("WARNING")
    assert "heartbeats missed" in silent, output
    assert Payment.objects.count() == 2


def test_a_source_that_cannot_reconnect_ends_the_whole_process(configure_outbox, amqp_url, proxy):
    """Two sources, one thread each: the second loses its broker for good. The process
    exits non-zero (a supervisor restarts it) instead of living on with one source."""
    queues = [f"outbox-test-{os.urandom(6).hex()}" for _ in range(2)]
    configure_outbox(
        INBOX={
            "SOURCES": {
                "alpha": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queues[0]},
                "beta": {"TRANSPORT": "kombu", "URL": through(proxy, amqp_url), "QUEUE": queues[1]},
            }
        }
    )
    declare(amqp_url, *queues)
    consumer = Consumer("alpha", "beta", "--max-outage", "2")
    try:
        publish(amqp_url, queues[0], ["alpha-1"])
        publish(amqp_url, queues[1], ["beta-1"])
        wait_handled(consumer, "alpha-", 1)
        wait_handled(consumer, "beta-", 1)
        proxy.down()
        started = time.monotonic()
        code = consumer.exit_code(timeout=30)
        took = time.monotonic() - started
    finally:
        consumer.stop(signal.SIGKILL)
        for queue in queues:
            services.delete_rabbitmq_queue(queue)
    output = consumer.output()
    assert code != 0, output
    assert took >= 2, output  # it tried for --max-outage seconds first
    [gave_up] = consumer.said("gave up")
    assert "inbox source 'beta'" in gave_up and f"127.0.0.1:{proxy.port}" in gave_up
    assert "Traceback" not in output, output


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
def test_a_broker_down_at_start_is_one_line_and_a_non_zero_exit(
    configure_outbox, queue_name, scheme
):
    closed = TcpProxy(RABBITMQ)  # a free port nobody listens on
    url = {
        "amqp": f"amqp://guest:secret@127.0.0.1:{closed.port}//",
        "redis": f"redis://:secret@127.0.0.1:{closed.port}/7",
    }[scheme]
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name}}}
    )
    consumer = Consumer("--max-outage", "2")
    code = consumer.exit_code(timeout=30)
    output = consumer.output()
    assert code != 0, output
    assert "Traceback" not in output, output
    assert "secret" not in output, output
    # One line when the outage began, one when it gave up, however many tries between.
    mentions = consumer.said(f"127.0.0.1:{closed.port}")
    assert len(mentions) == 2, output
    assert "inbox source 'shop'" in mentions[0] and "Connection refused" in mentions[0]
    assert "gave up" in mentions[1], output


def test_a_broker_that_refuses_the_consumer_ends_it_without_retrying(
    configure_outbox, amqp_url, queue_name
):
    url = amqp_url.replace("guest:guest@", "guest:wrong-password@")
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": url, "QUEUE": queue_name}}}
    )
    consumer = Consumer("--max-outage", "300")
    code = consumer.exit_code(timeout=30)  # not after 300 s: a password does not come back
    output = consumer.output()
    assert code != 0, output
    assert "Traceback" not in output, output
    assert "wrong-password" not in output
    [refused] = consumer.said("ACCESS_REFUSED")
    assert "inbox source 'shop'" in refused, output


@pytest.mark.broker_crash
def test_a_consumer_rides_out_a_rabbitmq_restart(configure_outbox, amqp_url, queue_name):
    """RabbitMQ itself is stopped and started again (a clean stop: its connections are
    closed with CONNECTION_FORCED) under a running consumer."""
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": amqp_url, "QUEUE": queue_name}}}
    )
    declare(amqp_url, queue_name)
    consumer = Consumer("--batch", "10", "--max-outage", "120")
    try:
        publish(amqp_url, queue_name, [f"before-{n}" for n in range(20)])
        wait_handled(consumer, "before-", 20)
        services.stop_rabbitmq_app()
        try:
            wait_for(lambda: consumer.said("WARNING"), timeout=30, what="the consumer to notice")
            time.sleep(2)
            assert consumer.alive(), consumer.output()
        finally:
            services.start_rabbitmq_app()
        # Published while the consumer is still waiting to reconnect.
        publish(amqp_url, queue_name, [f"during-{n}" for n in range(20)])
        wait_for(lambda: consumer.said("connected to"), timeout=60, what="the reconnection")
        publish(amqp_url, queue_name, [f"after-{n}" for n in range(20)])
        wait_handled(consumer, "during-", 20)
        wait_handled(consumer, "after-", 20)
    finally:
        code = consumer.stop()
    output = consumer.output()
    assert code == 0, output
    assert InboxMessage.objects.count() == 60
    assert Payment.objects.count() == 60
    assert len(consumer.said("WARNING")) == 1, output
    assert "Traceback" not in output, output
