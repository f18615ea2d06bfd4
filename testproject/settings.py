"""Settings of the test/demo project, read from the environment.

DATABASE_URL        default: SQLite file under var/
CELERY_BROKER_URL   default: kombu's filesystem transport under var/ (no services needed)
OUTBOX_BROKER_URL   where the "default" destination publishes; default: like the Celery broker
TESTPROJECT_SPANS_FILE  record OpenTelemetry spans there, one JSON line each (testproject.tracing)
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("TESTPROJECT_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("SECRET_KEY", "testproject-insecure-key")
DEBUG = os.environ.get("DEBUG", "1") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_outbox",
    "testproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
# The chaos harness's slow / 503 switch (tests/chaos): only when the harness sets it.
if os.environ.get("TESTPROJECT_CHAOS_WEBHOOK_FAULTS"):
    MIDDLEWARE.insert(0, "testproject.shop.faults.ChaosWebhookFaultsMiddleware")

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'demo.sqlite3'}"
if DATABASE_URL.startswith("mysql"):
    # The test project talks to MariaDB through PyMySQL (pure Python, no C
    # headers to install) standing in for mysqlclient, which projects should
    # use (django-outbox-inbox[mysql]). Django checks mysqlclient's version number.
    import pymysql

    pymysql.version_info = (2, 2, 7, "final", 0)
    pymysql.install_as_MySQLdb()
# Persistent connections (seconds) for long-running processes such as Celery
# workers: without them every task opens a new database connection.
DATABASES: dict[str, Any] = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=int(os.environ.get("TESTPROJECT_CONN_MAX_AGE", "0"))
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["OPTIONS"] = {
        # One writer at a time, taken at BEGIN: claims never deadlock on upgrade.
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

_FS_BROKER = VAR_DIR / "broker"
(_FS_BROKER / "out").mkdir(parents=True, exist_ok=True)
(_FS_BROKER / "processed").mkdir(parents=True, exist_ok=True)
(_FS_BROKER / "control").mkdir(parents=True, exist_ok=True)
FILESYSTEM_TRANSPORT_OPTIONS = {
    "data_folder_in": str(_FS_BROKER / "out"),
    "data_folder_out": str(_FS_BROKER / "out"),
    "processed_folder": str(_FS_BROKER / "processed"),
    # kombu otherwise creates ./control in the working directory.
    "control_folder": str(_FS_BROKER / "control"),
    "store_processed": False,
}


def for_test_worker(url: str) -> str:
    """*url*, or under pytest-xdist the Redis database of this worker in its place.

    ``make test`` runs the suite in two pytest-xdist workers (``gw0``, ``gw1``; their
    child processes inherit ``PYTEST_XDIST_WORKER``). The test Redis databases 13 (the
    ``redis_url`` fixture, emptied by each test) and 14 (Celery's broker) are then
    each worker's own: worker N takes 13 - 2N and 14 - 2N, so that no worker empties
    or consumes the other's. Any other URL is left as it is.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    prefix = "redis://127.0.0.1:6379/"
    if not worker.startswith("gw") or not url.startswith(prefix):
        return url
    database = url[len(prefix) :]
    if database not in ("13", "14"):
        return url
    return f"{prefix}{int(database) - 2 * int(worker[2:])}"


CELERY_BROKER_URL = for_test_worker(os.environ.get("CELERY_BROKER_URL", "filesystem://"))
if os.environ.get("CELERY_BROKER_URL", CELERY_BROKER_URL) != CELERY_BROKER_URL:
    # Celery reads the variable before this setting: without this, every pytest-xdist
    # worker (and the workers it starts) would share the one database it names, and
    # one emptying "its own" at its end would take the other's queued tasks.
    os.environ["CELERY_BROKER_URL"] = CELERY_BROKER_URL
if CELERY_BROKER_URL.startswith("filesystem"):
    CELERY_BROKER_TRANSPORT_OPTIONS = FILESYSTEM_TRANSPORT_OPTIONS
elif CELERY_BROKER_URL.startswith("amqp"):
    # What the docs ask for: without publisher confirms a RabbitMQ crash loses
    # task messages already recorded as sent (system check W016).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection around every task
# unless this is set; then each on-commit trigger pays a new connection.
CELERY_DB_REUSE_MAX = int(os.environ.get("TESTPROJECT_DB_REUSE_MAX", "0")) or None
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

OUTBOX_BROKER_URL = for_test_worker(os.environ.get("OUTBOX_BROKER_URL", CELERY_BROKER_URL))
_default_destination: dict[str, Any] = {
    "TRANSPORT": os.environ.get("OUTBOX_TRANSPORT", "kombu"),
    "URL": OUTBOX_BROKER_URL,
    "QUEUE": os.environ.get("OUTBOX_QUEUE", "shop-events"),
}
if OUTBOX_BROKER_URL.startswith("filesystem"):
    _default_destination["TRANSPORT_OPTIONS"] = FILESYSTEM_TRANSPORT_OPTIONS

DJANGO_OUTBOX: dict[str, Any] = {
    "OUTBOX": {
        "DESTINATIONS": {
            "default": _default_destination,
            # The demo's other side: this project's own inbox, as the billing service.
            "billing": {"TRANSPORT": "local", "SOURCE": "shop"},
        }
    },
    # ... and the inbox source it delivers into, declared (system check W006).
    "INBOX": {"SOURCES": {"shop": {"TRANSPORT": "local"}}},
    "BATCH_SIZE": int(os.environ.get("OUTBOX_BATCH_SIZE", "500")),
    "LEASE_SECONDS": float(os.environ.get("OUTBOX_LEASE_SECONDS", "60")),
    "RETRY_BASE_SECONDS": float(os.environ.get("OUTBOX_RETRY_BASE_SECONDS", "2")),
    "DISPATCH": os.environ.get("OUTBOX_DISPATCH", "celery"),
}

# Background jobs: Django's Tasks API (the django-tasks backport on Django 5.2).
TASKS = {
    "default": {
        "BACKEND": "django_outbox.jobs.JobsBackend",
        "QUEUES": ["default", "emails"],
    }
}

# The jobs benchmark runs django-tasks-db's db_worker beside ours (a peer, not a dependency).
if os.environ.get("TESTPROJECT_PEER_TASKS_DB"):
    INSTALLED_APPS.append("django_tasks_db")
    TASKS["peer"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}

# Tests and the demo hand a whole DJANGO_OUTBOX to subprocesses as JSON.
if os.environ.get("OUTBOX_SETTINGS_JSON"):
    import json

    DJANGO_OUTBOX = json.loads(os.environ["OUTBOX_SETTINGS_JSON"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_outbox": {
            "handlers": ["console"],
            "level": os.environ.get("OUTBOX_LOG_LEVEL", "WARNING"),
        },
        # Django logs every task's start and end at INFO (DEBUG is on here).
        "django.tasks": {"level": "WARNING"},
        "django_tasks": {"level": "WARNING"},
    },
}

# Tests with real processes: TESTPROJECT_SPANS_FILE records each process's spans there.
if os.environ.get("TESTPROJECT_SPANS_FILE"):
    from testproject.tracing import configure_from_environment

    configure_from_environment()
