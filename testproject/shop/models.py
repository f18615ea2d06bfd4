from django.db import models


class Order(models.Model):
    """A business row written in the same transaction as its outbox message."""

    customer = models.CharField(max_length=100)
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer}"


class Payment(models.Model):
    """What the inbox's handlers write: one row per handled payment event, so a test
    can count effects (exactly once) and see the order they came in."""

    order_ref = models.CharField(max_length=100)
    status = models.CharField(max_length=50)
    sequence = models.BigIntegerField(null=True)
    handled_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"payment {self.order_ref} {self.status}"


class OrderStatus(models.Model):
    """The newest known state of an order, kept by a ``latest``-ordered handler."""

    order_ref = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=50)
    sequence = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.order_ref}: {self.status}"
