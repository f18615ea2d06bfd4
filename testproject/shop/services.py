"""The demo's business logic: an order and its event, committed together."""

from django.db import transaction

import django_outbox
from testproject.shop.models import Order


def place_order(customer: str, total_cents: int, *, to: str = "default") -> Order:
    """Create an order and record ``order.created`` in the same transaction."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total_cents=total_cents)
        django_outbox.send(
            "order.created",
            {"order_id": order.pk, "customer": customer, "total_cents": total_cents},
            to=to,
            key=f"customer:{customer}",
        )
    return order
