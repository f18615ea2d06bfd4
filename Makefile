# The two commands of the README: `make demo` and `make test`.
# Everything else here is a step of those two or a documented extra
# (`make bench`, `make bench-admin`, `make chaos`, `make docs`, `make docs-serve`).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PY311 ?= $(shell command -v python3.11 || command -v python3)
PY312 ?= $(shell p=$$(pyenv prefix 3.12.1 2>/dev/null) && echo $$p/bin/python || command -v python3.12)
VENV := .venv
VENV6 := .venv-dj61
PG_URL ?= postgres://postgres@127.0.0.1:5432/django_outbox
MARIADB_URL ?= mysql://root@127.0.0.1:3306/django_outbox
TEST_BROKER_URL ?= redis://127.0.0.1:6379/14
PYTEST_ARGS ?= --durations=20
# Each test stage runs its tests in two pytest-xdist workers: the machine has two cores
# and most tests wait on processes and services. Each worker has a test database of its
# own (pytest-django's gw0/gw1 suffix) and Redis databases of its own
# (testproject.settings.for_test_worker); tests killing or cutting off connections pick
# them by database. The tests that stop RabbitMQ itself (broker_crash) then run alone.
# `make test XDIST=` runs every stage in one process.
XDIST ?= -n 2 --dist worksteal
# The package with its integrations, editable, plus the pinned contributor groups of
# pyproject.toml's [dependency-groups] (PEP 735: pip >= 25.1, hence the upgrade first).
PIP_INSTALL = bin/pip install -q --disable-pip-version-check
EDITABLE = -e ".[redis,postgres,http]" --group dev

.PHONY: help demo test lint docs docs-serve chromium test-postgres test-partitioned test-sqlite test-mariadb test-django6 test-chaos demo-ci bench bench-targets bench-ci bench-admin bench-inbox bench-jobs bench-jobs-phases bench-relay-phases bench-relay-cycle bench-webhook bench-webhook-instructions bench-jobs-instructions bench-inbox-instructions bench-send-instructions bench-soak flame bench-partitions bench-telemetry bench-tracing chaos chaos-services

help:
	@echo "make demo   set up and run the demo (SQLite + embedded broker unless DATABASE_URL/CELERY_BROKER_URL are set)"
	@echo "make test   set up and run the whole test suite (needs PostgreSQL, MariaDB, Redis, RabbitMQ)"
	@echo "make bench  the full relay benchmark (see docs/benchmarks.md)"
	@echo "make bench-targets  every performance target (relay, latency, jobs, inbox, webhook) in one run and one table of verdicts (about half an hour)"
	@echo "make bench-admin  the admin's pages and the health page and probe over 5 million rows per table on PostgreSQL (see docs/benchmarks.md)"
	@echo "make bench-inbox  inbox_consume against a plain kombu consumer and Celery acks_late (RabbitMQ)"
	@echo "make bench-jobs  jobs_worker against Celery and django-tasks-db, enqueue cost, latency"
	@echo "make bench-jobs-phases  where jobs_worker's CPU goes, phase by phase (thread CPU clocks)"
	@echo "make bench-relay-phases where the relay's CPU goes, phase by phase (thread CPU clocks)"
	@echo "make bench-relay-cycle  a relay cycle's CPU at 2 messages a cycle, against the lean relay's"
	@echo "make flame  flame graphs (py-spy) of the relay and of jobs_worker into docs/img/"
	@echo "make bench-webhook  the webhook under gunicorn against a bare INSERT, and commit → handled over HTTP"
	@echo "make bench-webhook-instructions  instructions a delivery costs the webhook view and the bare INSERT view (valgrind)"
	@echo "make bench-jobs-instructions  instructions a no-op job costs jobs_worker and the lean loops (valgrind)"
	@echo "make bench-inbox-instructions  instructions a message costs inbox_consume and the lean consumer (valgrind)"
	@echo "make bench-send-instructions  instructions a transaction with send() or enqueue() costs against a bare INSERT (valgrind)"
	@echo "make bench-soak  eight minutes at a steady 700 items/s beside 5 million finished rows: latency, backlog, claim cost, vacuum, memory"
	@echo "make bench-tracing  what tracing costs send() and the relay: off, the API alone, the SDK (see docs/benchmarks.md)"
	@echo "make chaos  crash and recovery tests at full size (relays SIGKILLed and SIGSTOPped, connections killed)"
	@echo "make chaos-services  two services and their jobs under faults at full size (SIGKILLs, hosts cut off, brokers and PostgreSQL restarted; see docs/reliability.md)"
	@echo "make docs   build the documentation site into site/ (mkdocs --strict: any warning or broken link fails)"
	@echo "make docs-serve  serve the documentation at http://$(DOCS_ADDR), rebuilt on every change"

$(VENV)/.installed: pyproject.toml
	$(PY311) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -U pip
	$(VENV)/bin/pip uninstall -q -y django-outbox 2>/dev/null || true  # the pre-rename name
	rm -rf django_outbox.egg-info
	$(VENV)/$(PIP_INSTALL) $(EDITABLE) --group django52
	touch $@

$(VENV6)/.installed: pyproject.toml
	$(PY312) -m venv $(VENV6)
	$(VENV6)/bin/pip install -q --disable-pip-version-check -U pip
	$(VENV6)/bin/pip uninstall -q -y django-outbox 2>/dev/null || true
	$(VENV6)/$(PIP_INSTALL) $(EDITABLE) --group django61
	touch $@

# Debian's chromium for the browser tests (tests/browser), installed when missing;
# Playwright drives it, no browser is ever downloaded. Without it those tests skip
# locally and fail under CI=true.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@[ -x $(CHROMIUM) ] || { \
		echo "installing Debian's chromium for the browser tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "could not install chromium: the browser tests will skip (fail under CI=true)" >&2; }

demo: $(VENV)/.installed
	$(VENV)/bin/python manage.py migrate -v0
	$(VENV)/bin/python manage.py outbox_demo

# Every stage in turn, each timed; the times are printed again at the end (and kept in
# var/test-stages.txt), so a slow CI run shows which stage took the time.
TEST_STAGES = lint docs test-postgres test-partitioned test-sqlite test-mariadb test-django6 \
	test-chaos demo-ci bench-ci

test: $(VENV)/.installed
	@mkdir -p var; : > var/test-stages.txt; \
	for stage in $(TEST_STAGES); do \
		began=$$(date +%s); \
		$(MAKE) --no-print-directory $$stage || { echo "stage $$stage failed"; cat var/test-stages.txt; exit 1; }; \
		echo "$$stage: $$(( $$(date +%s) - began )) s" >> var/test-stages.txt; \
	done; \
	echo "all test stages passed; each took:"; cat var/test-stages.txt

# The documentation site (mkdocs.yml, docs/): strict, so a warning, a broken link or
# a missing anchor fails the build. The docs group is installed into .venv once.
DOCS_ADDR ?= 127.0.0.1:8000
MKDOCS = NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

$(VENV)/.docs-installed: pyproject.toml $(VENV)/.installed
	$(VENV)/$(PIP_INSTALL) --group docs
	touch $@

docs: $(VENV)/.docs-installed
	$(MKDOCS) build --strict --clean --site-dir site

# Not strict: a page in progress is served with its warnings printed (make docs is the gate).
docs-serve: $(VENV)/.docs-installed
	$(MKDOCS) serve --no-strict --dev-addr $(DOCS_ADDR)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy django_outbox
	$(VENV)/bin/python manage.py makemigrations --check --dry-run

# Django 5.2 / Python 3.11 on PostgreSQL: every test, real services.
test-postgres: $(VENV)/.installed chromium
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db $(XDIST) \
		-m "not restarts_services and not partitioned and not broker_crash" $(PYTEST_ARGS)
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db \
		-m "broker_crash and not restarts_services and not partitioned" $(PYTEST_ARGS)

# PostgreSQL with the three tables partitioned by time (outbox_partition convert, run
# on the test database before the session): the tests of partitioning, and the
# integration, property and contract tests again, over partitioned tables. Not the
# tests of query plans (empty partitions are scanned, as they should be), nor those
# that expect the purge to delete expired rows at once (they go with their partition).
test-partitioned: $(VENV)/.installed
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) DJANGO_OUTBOX_TEST_PARTITIONED=1 \
		$(VENV)/bin/python -m pytest --create-db $(XDIST) \
		-m "not processes and not browser and not plans and not plain_retention and not restarts_services" \
		tests/integration tests/properties tests/conformance $(PYTEST_ARGS)

# The two-service chaos run, reduced: it restarts PostgreSQL, Redis and RabbitMQ, so
# it runs alone, in a pytest session of its own (a restart in the middle of the
# suite would disturb the other tests' connections and threads).
test-chaos: $(VENV)/.installed
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db -s -m restarts_services \
		tests/acceptance/test_chaos_services.py $(PYTEST_ARGS)

# The embedded default: everything that does not need PostgreSQL row locks.
test-sqlite: $(VENV)/.installed chromium
	DATABASE_URL= CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db $(XDIST) \
		-m "not postgres and not row_locks and not broker_crash" $(PYTEST_ARGS)
	DATABASE_URL= CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db \
		-m "broker_crash and not postgres and not row_locks" $(PYTEST_ARGS)

# MariaDB: SKIP LOCKED claims, so the multi-process tests run here too (RabbitMQ
# crashed under a relay is a broker test, and the process tests of what lies above
# the database are marked one_database: they run once, on PostgreSQL).
test-mariadb: $(VENV)/.installed chromium
	DATABASE_URL=$(MARIADB_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV)/bin/python -m pytest --create-db $(XDIST) \
		-m "not broker_crash and not one_database and not restarts_services and not partitioned" $(PYTEST_ARGS)

# Django 6.1 / Python 3.12 on PostgreSQL. The real-process crash tests (SIGKILL,
# SIGSTOP, killed brokers and connections) test the database's and the broker's
# behaviour: they run under Django 5.2 on PostgreSQL and MariaDB, not again here,
# except those of the jobs, which run on Django's own django.tasks here.
test-django6: $(VENV6)/.installed chromium
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(VENV6)/bin/python -m pytest --create-db $(XDIST) \
		-m "(not processes or jobs) and not restarts_services and not partitioned and not broker_crash" \
		$(PYTEST_ARGS)

# The demo, smaller, on its own SQLite file and embedded broker.
demo-ci: $(VENV)/.installed
	export TESTPROJECT_VAR_DIR=$$(mktemp -d) DATABASE_URL= CELERY_BROKER_URL= OUTBOX_BROKER_URL=; \
		unset DATABASE_URL CELERY_BROKER_URL OUTBOX_BROKER_URL; \
		$(VENV)/bin/python manage.py migrate -v0 && $(VENV)/bin/python manage.py outbox_demo --orders 90

bench: $(VENV)/.installed
	$(VENV)/$(PIP_INSTALL) $(EDITABLE) --group django52 --group peers
	$(VENV)/bin/python -m tests.benchmarks.relay --messages 100000 --repeat 3
	$(VENV)/bin/python -m tests.benchmarks.latency --rates 300,500 --seconds 10 --repeat 3

bench-ci: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.targets --reduced
	$(VENV)/bin/python -m tests.benchmarks.trigger_cost --triggers 200 --repeat 1
	$(VENV)/bin/python -m tests.benchmarks.admin_changelist --rows 20000 --repeat 1 --informational
	$(VENV)/bin/python -m tests.benchmarks.admin_health --rows 20000 --repeat 1 --informational
	$(VENV)/bin/python -m tests.benchmarks.jobs_phases --jobs 2000
	$(VENV)/bin/python -m tests.benchmarks.relay_phases --messages 5000 --repeat 1
	$(VENV)/bin/python -m tests.benchmarks.relay_cycle --cycles 200 --repeat 1 --phases
	$(VENV)/bin/python -m tests.benchmarks.partitions --rows 20000 --days 3 --items 300 --repeat 1 --informational
	$(VENV)/bin/python -m tests.benchmarks.webhook_instructions --deliveries 50 --smoke
	$(VENV)/bin/python -m tests.benchmarks.jobs_instructions --jobs 500 --smoke
	$(VENV)/bin/python -m tests.benchmarks.inbox_instructions --messages 1000 --smoke
	$(VENV)/bin/python -m tests.benchmarks.send_instructions --transactions 100 --smoke
	$(VENV)/bin/python -m tests.benchmarks.soak --rate 200 --minutes 0.5 --window 15

# The admin's list and message pages over 5 million rows on PostgreSQL, in a database
# of their own (created, then dropped). Several minutes, most of them filling the table.
bench-inbox: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.inbox --messages 60000 --processes 2 --repeat 3

# The three parts over many finished rows, plain and partitioned by day: throughput,
# the admin's lists, and the purge of one day (issue 16 §6). Hours at 50 million rows
# (most of it filling the tables); PARTITION_BENCH_ROWS sets the size.
PARTITION_BENCH_ROWS ?= 50000000
bench-partitions: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.partitions --rows $(PARTITION_BENCH_ROWS) --days 7 --items 5000 --repeat 3

# Jobs: jobs_worker (1 and 2 processes) against a Celery solo worker and django-tasks-db's
# db_worker, enqueue against a bare INSERT and delay_on_commit, enqueue -> start latency.
flame: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.flame relay --messages 100000 --out docs/img/flame-relay.svg
	$(VENV)/bin/python -m tests.benchmarks.flame jobs --jobs 20000 --out docs/img/flame-jobs.svg

bench-webhook: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.webhook --requests 6000 --repeat 3 --rate 500 --seconds 10 --batches 1,100

# The instructions a delivery costs the webhook view against the bare INSERT view,
# counted by valgrind (apt install valgrind): a figure the machine's noise does not move.
bench-webhook-instructions: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.webhook_instructions --deliveries 500

# The same for a no-op job: jobs_worker's drain against the lean loops (valgrind).
bench-jobs-instructions: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.jobs_instructions --jobs 5000

# The same for a message from RabbitMQ: inbox_consume against the lean consumer (valgrind).
bench-inbox-instructions: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.inbox_instructions --messages 5000

# The same for a business transaction: an order with send() or enqueue() against the same
# order with a bare INSERT of the row (valgrind).
bench-send-instructions: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.send_instructions --transactions 2000

# A steady rate for eight minutes beside 5 million finished messages and jobs, nothing
# purged (issue 17 §8): is anything growing? Its own database, made again; about 15
# minutes with the fill. SOAK_FINISHED=0 leaves the fill out.
SOAK_FINISHED ?= 5000000
bench-soak: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.soak --rate 700 --minutes 8 --window 30 --finished $(SOAK_FINISHED)

# Every target of issue 17 in one run (the harnesses of bench, bench-jobs, bench-inbox
# and bench-webhook, one after the other), then one table of verdicts. About half an hour.
bench-targets: $(VENV)/.installed
	$(VENV)/$(PIP_INSTALL) $(EDITABLE) --group django52 --group peers
	$(VENV)/bin/python -m tests.benchmarks.targets

bench-jobs: $(VENV)/.installed
	$(VENV)/$(PIP_INSTALL) $(EDITABLE) --group django52 --group peers
	$(VENV)/bin/python -m tests.benchmarks.jobs --jobs 60000 --repeat 3

bench-jobs-phases: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.jobs_phases --jobs 20000

bench-relay-phases: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.relay_phases --messages 50000 --repeat 3

bench-relay-cycle: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.relay_cycle --cycles 3000 --messages 2 --repeat 3 --phases

# What counting costs send(), the relay, the inbox and the jobs (telemetry off, the
# health page's per-minute tally, Prometheus metrics), in rounds that take turns.
bench-telemetry: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.telemetry --items 5000 --rounds 5

# What tracing costs send() and the relay (issue 15: nothing when off, at most 5 % on).
bench-tracing: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.tracing --messages 20000 --rounds 5

bench-admin: $(VENV)/.installed
	$(VENV)/bin/python -m tests.benchmarks.admin_changelist --rows 5000000 --repeat 5
	$(VENV)/bin/python -m tests.benchmarks.admin_health --rows 5000000 --repeat 5

# The crash and recovery acceptance tests at full size (make test runs them reduced).
chaos: $(VENV)/.installed
	DATABASE_URL=$(PG_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) CHAOS_MESSAGES=20000 CHAOS_KILLS=12 \
		$(VENV)/bin/python -m pytest --create-db -s tests/acceptance/test_chaos.py \
		tests/acceptance/test_recovery.py tests/acceptance/test_crash.py $(PYTEST_ARGS)

# Two services (A and B, each its own PostgreSQL database), their relays, consumers,
# webhook and job workers, some inside network-namespace hosts, under a seeded
# schedule of faults; the invariants are checked from both databases at the end.
# Needs root (ip netns). The reduced run is tests/acceptance/test_chaos_services.py.
chaos-services: $(VENV)/.installed
	$(VENV)/bin/python -m tests.chaos --messages 20000 --jobs 5000 --kills 60 --cuts 3 \
		--seconds 300 --cut-min 10 --cut-max 30 --duplicates 600 --max-drain 10 \
		--report var/chaos-services.json
