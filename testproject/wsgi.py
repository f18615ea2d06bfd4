"""The test project's WSGI application (``gunicorn testproject.wsgi``: the webhook
benchmark and the two-service runs serve the inbox's webhook with it)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

application = get_wsgi_application()
