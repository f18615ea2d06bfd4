"""Transports: how a destination's messages leave the process."""

from django_outbox.outbox.transports.base import Outcomes, Transport

__all__ = ["Outcomes", "Transport"]
