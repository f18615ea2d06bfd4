"""The health of the three parts, in figures an operator and a probe can read cheaply.

One service (``health.figures.read``) reads, for the outbox, the inbox and the jobs,
what the admin's health page, the JSON probe (``health.views``), ``manage.py
outbox_stats`` and the Prometheus gauges show: counts per state, what is due and how
late, parked keys, uncertain rows, gaps, batches, the per-minute outcomes of the last
hour, the workers and what they hold, the sweeps, and the failures grouped by cause
(``health.failures``). ``health.status`` judges them against the ``HEALTH`` settings
(ok, warning, critical).

Every figure has a bounded cost, whatever the size of the tables: counts go through
the partial indexes and stop at a cap, the finished rows of a large PostgreSQL table
are the planner's estimate, and each figure says which it is (``Count.kind``). Nothing
here is imported at start-up: the app's models import only ``health.models``.
"""
