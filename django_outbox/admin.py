"""Admin for outgoing messages: read-only rows, guarded requeue/cancel actions."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from django_outbox.outbox.models import (
    CANCELLABLE_STATES,
    REQUEUEABLE_STATES,
    OutboxMessage,
    OutboxState,
)


def _pretty(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, default=str))


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "type",
        "destination",
        "state",
        "attempts",
        "key",
        "sequence",
        "available_at",
        "created_at",
        "sent_at",
        "uncertain",
    )
    list_filter = ("state", "destination", "type", "uncertain")
    search_fields = ("=message_id", "=key", "=correlation_id")
    date_hierarchy = None
    list_per_page = 100
    show_full_result_count = False  # counting a huge table on every page view is slow
    actions = ("requeue_messages", "cancel_messages")
    fieldsets = (
        (None, {"fields": ("message_id", "type", "destination", "state", "uncertain")}),
        ("Ordering", {"fields": ("key", "sequence", "correlation_id")}),
        ("Content", {"fields": ("payload_pretty", "headers_pretty")}),
        (
            "Delivery",
            {
                "fields": (
                    "attempts",
                    "available_at",
                    "locked_until",
                    "lock_token",
                    "last_error_pretty",
                    "created_at",
                    "sent_at",
                    "finished_at",
                )
            },
        ),
    )
    readonly_fields = (
        "message_id",
        "type",
        "destination",
        "state",
        "uncertain",
        "key",
        "sequence",
        "correlation_id",
        "payload_pretty",
        "headers_pretty",
        "attempts",
        "available_at",
        "locked_until",
        "lock_token",
        "last_error_pretty",
        "created_at",
        "sent_at",
        "finished_at",
    )

    @admin.display(description="payload")
    def payload_pretty(self, obj: OutboxMessage) -> str:
        return _pretty(obj.payload)

    @admin.display(description="headers")
    def headers_pretty(self, obj: OutboxMessage) -> str:
        return _pretty(obj.headers)

    @admin.display(description="last error")
    def last_error_pretty(self, obj: OutboxMessage) -> str:
        return format_html("<pre>{}</pre>", obj.last_error or "—")

    # Messages are created by send() and removed by the purge only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.requeue_outboxmessage")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.cancel_outboxmessage")

    @admin.action(
        description="Requeue selected messages (send_error → should_be_sent)",
        permissions=["requeue"],
    )
    def requeue_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        self._apply(request, queryset, "requeue", REQUEUEABLE_STATES)

    @admin.action(description="Cancel selected messages", permissions=["cancel"])
    def cancel_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> None:
        self._apply(request, queryset, "cancel", CANCELLABLE_STATES)

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[OutboxMessage],
        verb: str,
        allowed: tuple[OutboxState, ...],
    ) -> None:
        selected = queryset.count()
        # The changelist's own queryset (and database); the domain method
        # keeps only the rows in an allowed state.
        moved = getattr(queryset.order_by(), verb)()
        past = {"requeue": "requeued", "cancel": "cancelled"}[verb]
        self.message_user(request, f"{moved} message(s) {past}.", messages.SUCCESS)
        if moved < selected:
            states = ", ".join(s.value for s in allowed)
            self.message_user(
                request,
                f"{selected - moved} message(s) skipped: only messages in {states} can be {past}.",
                messages.WARNING,
            )
