from django.db import models


class Order(models.Model):
    """A business row written in the same transaction as its outbox message."""

    customer = models.CharField(max_length=100)
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer}"
