"""Admin for incoming messages: read-only rows, who is handling a message (and whether it
is stuck), guarded and logged requeue / skip on the list and on a message's page, and
the release of a strict key's gap."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from django_outbox.admin.actions import Action, OperatorActions
from django_outbox.admin.held import HeldFilter, HeldRows
from django_outbox.admin.search import IndexedSearch, Search
from django_outbox.admin.shared import (
    AttemptsFilter,
    ConfiguredValuesFilter,
    EstimatedCountPaginator,
    HasErrorFilter,
    ReadOnlyRows,
    pretty_json,
    pretty_text,
)
from django_outbox.engine.operator import Moved, Verb
from django_outbox.inbox.models import InboxMessage, InboxState


def _release(rows: Any) -> Moved:
    """Release the gaps of the selected messages that wait for one."""
    waiting = rows.waiting_for_gap()
    ids = list(waiting.values_list("pk", flat=True))
    released = waiting.release_gaps()
    return Moved(ids=ids if released else [])


#: Sources the search's id lookup names (``source IN (…)``) to use the unique index on
#: (source, message_id); with more, it reads the table.
SEARCHED_SOURCES = 100


def _by_sender_id(rows: QuerySet[InboxMessage], term: str) -> QuerySet[InboxMessage]:
    sources = InboxMessage.objects.using(rows.db).sources(limit=SEARCHED_SOURCES)
    if len(sources) < SEARCHED_SOURCES:
        return rows.filter(source__in=sources, message_id=term)
    return rows.filter(message_id=term)


def _by_correlation_or_key(rows: QuerySet[InboxMessage], term: str) -> QuerySet[InboxMessage]:
    return rows.filter(Q(correlation_id=term) | Q(key__startswith=term))


#: The sender's message id (the unique index, one seek per source); else a correlation
#: id or the start of a key (0017's indexes); ``type:`` by the start of a type.
INBOX_SEARCH = Search(ids=_by_sender_id, others=_by_correlation_or_key, type_field="type")


class WaitingForGapFilter(admin.SimpleListFilter):
    """Messages of ``strict`` keys waiting for an earlier sequence that has not come."""

    title = "ordering"
    parameter_name = "gap"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("waiting", "waiting for a gap")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "waiting":
            return queryset.waiting_for_gap()  # type: ignore[attr-defined,no-any-return]
        return queryset


class SourceFilter(ConfiguredValuesFilter):
    """Every source that is configured (a declared source, the source a local
    destination delivers into, idempotent tasks' source) or has rows (``receive()``
    takes any name): read with one index seek per source, not a ``DISTINCT``."""

    title = "source"
    parameter_name = "source"
    field_name = "source"

    def values(self) -> list[str]:
        from django_outbox.conf import get_settings
        from django_outbox.inbox.tasks import TASK_SOURCE
        from django_outbox.outbox.transports.local import local_sources

        config = get_settings()
        return [
            *config.inbox.sources,
            *local_sources(config.outbox.destinations.values()),
            TASK_SOURCE,
        ]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        stored = InboxMessage.objects.using(model_admin.get_queryset(request).db).sources()
        return [(value, value) for value in sorted({*self.values(), *stored})]


@admin.register(InboxMessage)
class InboxMessageAdmin(
    IndexedSearch,
    OperatorActions,
    HeldRows,
    ReadOnlyRows,
    admin.ModelAdmin,  # type: ignore[type-arg]
):
    part_name = "inbox"
    # A row's page: a button for each action its state allows (OperatorActions).
    change_form_template = "django_outbox/admin/change_form.html"
    consequences = {Verb.SKIP: "a skipped message is never handled, and this cannot be undone"}
    own_actions = {
        # Strict keys only: not a button (the list's gap filter finds them).
        "release": Action(
            name="release",
            past="released from their gap",
            allowed=(InboxState.SHOULD_BE_HANDLED,),
            apply=_release,
            on_page=False,
            permission="requeue",
        ),
    }
    list_display = (
        "id",
        "type",
        "source",
        "state",
        "held_by",
        "attempts",
        "key",
        "sequence",
        "error",
        "created_at",
        "finished_at",
    )
    list_filter = (
        "state",
        HeldFilter,
        HasErrorFilter,
        AttemptsFilter,
        WaitingForGapFilter,
        SourceFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    # Shows the search box; INBOX_SEARCH reads it (admin.search).
    search_fields = ("message_id", "correlation_id", "key")
    search = INBOX_SEARCH
    search_help_text = (
        "The sender's message id or a correlation id (exact, case-sensitive), or the start "
        "of a key (case-sensitive). type:<start of a type> reads the list in order: filter "
        "it first."
    )
    list_per_page = 100
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    actions = ("requeue_messages", "skip_messages", "release_gaps")
    fieldsets = (
        (None, {"fields": ("source", "message_id", "type", "state")}),
        ("Ordering", {"fields": ("key", "sequence", "correlation_id", "in_reply_to")}),
        ("Content", {"fields": ("payload_pretty", "headers_pretty", "raw_body")}),
        (
            "Handling",
            {
                "fields": (
                    "attempts",
                    "available_at",
                    "last_error_pretty",
                    "traceback_pretty",
                    "created_at",
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
                    "claimed_by",
                )
            },
        ),
    )
    readonly_fields = tuple(str(name) for _, section in fieldsets for name in section["fields"])

    @admin.display(description="payload")
    def payload_pretty(self, obj: InboxMessage) -> str:
        return pretty_json(obj.payload)

    @admin.display(description="headers")
    def headers_pretty(self, obj: InboxMessage) -> str:
        return pretty_json(obj.headers)

    @admin.display(description="traceback")
    def traceback_pretty(self, obj: InboxMessage) -> str:
        return pretty_text(obj.traceback)

    @admin.display(description="in reply to")
    def in_reply_to(self, obj: InboxMessage) -> str:
        """For a reply: the request this service sent (same correlation id, sent with
        ``reply_to`` naming this message's source)."""
        from django_outbox.outbox.models import OutboxMessage
        from django_outbox.wire import HEADER_REPLY_TO

        if not obj.correlation_id:
            return "—"
        requests = OutboxMessage.objects.using(obj._state.db).filter(
            correlation_id=obj.correlation_id
        )
        for request in requests[:20]:
            if (request.headers or {}).get(HEADER_REPLY_TO) == obj.source:
                url = reverse("admin:django_outbox_outboxmessage_change", args=[request.pk])
                return format_html(
                    '<a href="{}">{} (outbox #{})</a>', url, request.type, request.pk
                )
        return "—"

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.requeue_inboxmessage")

    def has_skip_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.skip_inboxmessage")

    @admin.action(
        description="Requeue selected messages (handle_error → should_be_handled)",
        permissions=["requeue"],
    )
    def requeue_messages(
        self, request: HttpRequest, queryset: QuerySet[InboxMessage]
    ) -> HttpResponse | None:
        return self.operate(request, queryset, "requeue")

    @admin.action(description="Skip selected messages…", permissions=["skip"])
    def skip_messages(
        self, request: HttpRequest, queryset: QuerySet[InboxMessage]
    ) -> HttpResponse | None:
        return self.operate(request, queryset, "skip")

    @admin.action(
        description="Stop waiting for the missing messages (strict keys)", permissions=["requeue"]
    )
    def release_gaps(
        self, request: HttpRequest, queryset: QuerySet[InboxMessage]
    ) -> HttpResponse | None:
        return self.operate(request, queryset, "release")
