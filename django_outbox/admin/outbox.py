"""Admin for outgoing messages: read-only rows, who holds a message being sent (and
whether it is stuck), guarded and logged requeue / cancel on the list and on a
message's page."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from django_outbox.admin.actions import OperatorActions
from django_outbox.admin.held import HeldFilter, HeldRows
from django_outbox.admin.search import IndexedSearch, Search, as_uuid
from django_outbox.admin.shared import (
    AttemptsFilter,
    ConfiguredValuesFilter,
    EstimatedCountPaginator,
    HasErrorFilter,
    ReadOnlyRows,
    pretty_json,
)
from django_outbox.conf import get_settings
from django_outbox.engine.operator import Verb
from django_outbox.outbox.models import UNFINISHED_STATES, OutboxMessage
from django_outbox.wire import HEADER_REPLY_TO


def _by_message_id(rows: QuerySet[OutboxMessage], term: str) -> QuerySet[OutboxMessage] | None:
    message_id = as_uuid(term)
    return None if message_id is None else rows.filter(message_id=message_id)


def _by_correlation_or_key(rows: QuerySet[OutboxMessage], term: str) -> QuerySet[OutboxMessage]:
    return rows.filter(Q(correlation_id=term) | Q(key__startswith=term))


#: A message id (unique index); else a correlation id or the start of a key (0017's
#: indexes); ``type:`` by the start of a type.
OUTBOX_SEARCH = Search(ids=_by_message_id, others=_by_correlation_or_key, type_field="type")


class DestinationFilter(ConfiguredValuesFilter):
    title = "destination"
    parameter_name = "destination"
    field_name = "destination"

    def values(self) -> list[str]:
        return list(get_settings().outbox.destinations)


@admin.register(OutboxMessage)
class OutboxMessageAdmin(
    IndexedSearch,
    OperatorActions,
    HeldRows,
    ReadOnlyRows,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    part_name = "outbox"
    # A row's page: a button for each action its state allows (OperatorActions).
    change_form_template = "django_outbox/admin/change_form.html"
    consequences = {Verb.CANCEL: "a cancelled message is never sent, and this cannot be undone"}
    list_display = (
        "id",
        "type",
        "destination",
        "state",
        "held_by",
        "attempts",
        "key",
        "sequence",
        "error",
        "available_at",
        "created_at",
        "sent_at",
        "uncertain",
    )
    list_filter = (
        "state",
        HeldFilter,
        HasErrorFilter,
        AttemptsFilter,
        DestinationFilter,
        "uncertain",
        "blocked",
        ("created_at", admin.DateFieldListFilter),
    )
    # Shows the search box; OUTBOX_SEARCH reads it (admin.search).
    search_fields = ("message_id", "correlation_id", "key")
    search = OUTBOX_SEARCH
    search_help_text = (
        "A message id or a correlation id (exact, case-sensitive), or the start of a key "
        "(case-sensitive). type:<start of a type> reads the list in order: filter it first."
    )
    list_per_page = 100
    # Counting a huge table on every page view is slow: no full count, and the
    # unfiltered list counts from the table's statistics (PostgreSQL).
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("requeue_messages", "cancel_messages")
    fieldsets = (
        (None, {"fields": ("message_id", "type", "destination", "state", "uncertain")}),
        (
            "Ordering",
            {"fields": ("key", "sequence", "waiting_behind", "correlation_id", "replies")},
        ),
        ("Content", {"fields": ("payload_pretty", "headers_pretty")}),
        (
            "Delivery",
            {
                "fields": (
                    "attempts",
                    "available_at",
                    "last_error_pretty",
                    "created_at",
                    "sent_at",
                    "finished_at",
                )
            },
        ),
        (
            "Worker",
            {
                "fields": (
                    "held_by_detail",
                    "worker_heartbeat",
                    "lease_ends",
                    "attempt_started",
                    "lock_token",
                    "claimed_by",
                )
            },
        ),
    )
    # Every field shown is read-only: rows change through send(), the relay and
    # the operator actions only.
    readonly_fields = tuple(str(name) for _, section in fieldsets for name in section["fields"])

    # -- display -------------------------------------------------------------

    @admin.display(description="payload")
    def payload_pretty(self, obj: OutboxMessage) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="headers")
    def headers_pretty(self, obj: OutboxMessage) -> str:
        return pretty_json(obj.headers)

    @admin.display(description="waiting behind it")
    def waiting_behind(self, obj: OutboxMessage) -> str:
        """For a message with a key: how many later messages of its key wait, with a link."""
        if obj.key is None:
            return "—"
        waiting = (
            OutboxMessage.objects.using(obj._state.db)
            .filter(
                destination=obj.destination,
                key=obj.key,
                sequence__gt=obj.sequence,
                state__in=UNFINISHED_STATES,
            )
            .count()
        )
        if not waiting:
            return "none"
        url = reverse("admin:django_outbox_outboxmessage_changelist")
        return format_html(
            '<a href="{}?destination={}&amp;key={}">{} message(s) of this key</a>',
            url,
            obj.destination,
            obj.key,
            waiting,
        )

    @admin.display(description="replies")
    def replies(self, obj: OutboxMessage) -> str:
        """For a request (sent with ``reply_to``): the replies that arrived in the inbox."""
        from django_outbox.inbox.models import InboxMessage

        source = (obj.headers or {}).get(HEADER_REPLY_TO)
        if not source or not obj.correlation_id:
            return "—"
        replies = list(
            InboxMessage.objects.using(obj._state.db)
            .filter(source=source, correlation_id=obj.correlation_id)
            .order_by("pk")[:10]
        )
        if not replies:
            return f"none yet (expected on source {source!r})"
        return format_html_join(
            ", ",
            '<a href="{}">{} [{}] (inbox #{})</a>',
            (
                (
                    reverse("admin:django_outbox_inboxmessage_change", args=[r.pk]),
                    r.type,
                    r.state,
                    r.pk,
                )
                for r in replies
            ),
        )

    # -- permissions ---------------------------------------------------------

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.requeue_outboxmessage")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.cancel_outboxmessage")

    # -- list actions (a message's page has a button for each) -------------------

    @admin.action(
        description="Requeue selected messages (send_error → should_be_sent)",
        permissions=["requeue"],
    )
    def requeue_messages(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> HttpResponse | None:
        return self.operate(request, queryset, "requeue")

    @admin.action(description="Cancel selected messages…", permissions=["cancel"])
    def cancel_messages(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage]
    ) -> HttpResponse | None:
        return self.operate(request, queryset, "cancel")
