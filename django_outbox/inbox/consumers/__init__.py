"""Where inbox messages come from: a kombu consumer, a Celery task, a webhook view."""
