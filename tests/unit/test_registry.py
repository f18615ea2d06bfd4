import threading

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
