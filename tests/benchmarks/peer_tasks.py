"""The jobs benchmark's no-op task on django-tasks-db (imported only when that peer runs)."""

from django_outbox.jobs.compat import task


@task(backend="peer")
def peer_noop():
    return None
