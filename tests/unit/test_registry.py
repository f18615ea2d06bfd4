import threading

import pytest

from django_outbox.conf import Destination
from django_outbox.outbox.transports import registry


def test_each_thread_gets_its_own_transport_and_keeps_it():
    destination = Destination(name="d", transport="memory")
    seen = {}
    both_alive = threading.Barrier(2)  # thread ids are reused once a thread ends

    def fetch(name):
        seen[name] = (registry.get_transport(destination), registry.get_transport(destination))
        both_alive.wait(5)

    threads = [threading.Thread(target=fetch, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (a1, a2), (b1, b2) = seen["a"], seen["b"]
    assert a1 is a2 and b1 is b2  # reused within a thread
    assert a1 is not b1  # never shared between threads
    registry.close_all()


class Closing:
    closed = 0


def test_a_threads_transports_are_closed_when_the_thread_ends(monkeypatch):
    from django_outbox.outbox.transports.memory import MemoryTransport

    def close(self):
        Closing.closed += 1

    monkeypatch.setattr(MemoryTransport, "close", close)
    Closing.closed = 0
    destination = Destination(name="d", transport="memory")
    before = registry.open_count()
    # As a gevent pool does: every task in a short-lived thread of its own.
    for _ in range(50):
        thread = threading.Thread(target=registry.get_transport, args=(destination,))
        thread.start()
        thread.join()
    import gc

    gc.collect()
    assert Closing.closed == 50
    assert registry.open_count() == before


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_neither_uses_nor_closes_the_parents_transports(monkeypatch):
    import os

    from django_outbox.outbox.transports.memory import MemoryTransport

    closed = []
    monkeypatch.setattr(MemoryTransport, "close", lambda self: closed.append(os.getpid()))
    destination = Destination(name="d", transport="memory")
    parent = registry.get_transport(destination)
    pid = os.fork()
    if pid == 0:  # the child: a transport of its own, and the parent's left alone
        import gc

        child = registry.get_transport(destination)
        gc.collect()
        os._exit(0 if child is not parent and os.getpid() not in closed else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert registry.get_transport(destination) is parent
    registry.close_all()
