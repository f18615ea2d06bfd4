"""The admin's health page: the three parts on one page (``django_outbox.health``), and
actions on whole failure groups.

The page is the changelist of ``Health`` (a proxy with no table: the admin's index
lists it under this app) and is linked from each part's list. Whoever may view a part
sees its figures, its chart and its failure groups. A group is requeued (retried),
cancelled or skipped as a whole after a confirmation, by an operator who holds the
permission the part's own action needs; the rows are found anew and moved by the
engine (``health.failures.act``, in bounded chunks), and one entry in the admin's
history names the group and the count.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from django_outbox.engine import operator
from django_outbox.engine.part import Part, registered
from django_outbox.health import chart, failures, figures, status
from django_outbox.health.models import Health

#: Seconds between refreshes a page may ask for (``?refresh=``).
REFRESH_RANGE = (5, 600)
#: Rows of a group listed on its confirmation page.
SHOWN_ROWS = 20


@admin.register(Health)
class HealthAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The health page and its group actions (no rows to add, change or delete)."""

    def _part_admin(self, name: str) -> Any:
        part = registered().get(name)
        if part is None:
            return None
        return self.admin_site._registry.get(part.model)

    def visible_parts(self, request: HttpRequest) -> list[str]:
        """The parts whose rows *request*'s user may view."""
        shown = []
        for name in figures.PARTS:
            part_admin = self._part_admin(name)
            if part_admin is not None and part_admin.has_view_or_change_permission(request):
                shown.append(name)
        return shown

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(self.visible_parts(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        wrap: Callable[..., Any] = self.admin_site.admin_view
        return [
            path("", wrap(self.health_view), name="django_outbox_health_changelist"),
            path("group/", wrap(self.group_view), name="django_outbox_health_group"),
        ]

    # -- the page ----------------------------------------------------------------------

    def health_view(self, request: HttpRequest) -> HttpResponse:
        parts = self.visible_parts(request)
        if not parts:
            raise PermissionDenied
        report = status.evaluate(figures.read(self.using(), parts=parts))
        health = report.health
        context = {
            **self.admin_site.each_context(request),
            "title": "Health of the outbox, the inbox and the jobs",
            "opts": self.model._meta,
            "report": report,
            "now": health.now,
            "refresh": _refresh(request),
            "parts": [
                self._part_context(request, name, health.parts[name], report) for name in parts
            ],
            "workers": [_worker_context(worker, health.now) for worker in health.workers],
        }
        return TemplateResponse(request, "django_outbox/admin/health.html", context)

    def _part_context(
        self, request: HttpRequest, name: str, part: figures.PartFigures, report: status.Report
    ) -> dict[str, Any]:
        engine_part = registered()[name](using=self.using())
        meta = engine_part.model._meta
        changelist = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        words = [_word(engine_part, verb) for verb in failures.verbs(engine_part)]
        allowed = [word for word in words if self._may(request, engine_part, word)]
        groups = []
        for group in part.failures.groups if part.failures is not None else ():
            query = {"part": name, "kind": group.kind, "target": group.target}
            groups.append(
                {
                    "group": group,
                    "list": f"{changelist}?{urlencode(_list_filters(engine_part, group))}",
                    "actions": [
                        {
                            "word": word,
                            "url": f"{reverse('admin:django_outbox_health_group')}?"
                            + urlencode({**query, "verb": word}),
                        }
                        for word in allowed
                    ],
                }
            )
        return {
            "name": name,
            "figures": part,
            "checks": [check for check in report.checks if check.part == name],
            "changelist": changelist,
            "failed_list": f"{changelist}?state__exact={engine_part.lifecycle.failed}",
            "chart": chart.svg(
                {"done": part.throughput(), "failed": part.failure_rate()},
                end=report.health.now,
                title=f"{name}: rows done and failed per minute, the last hour",
            ),
            "groups": groups,
            "target_label": failures.TARGETS[name].replace("_", " "),
        }

    # -- a failure group ----------------------------------------------------------------

    def group_view(self, request: HttpRequest) -> HttpResponse:
        """GET: what the action would move, and a button to confirm; POST (confirmed):
        move the group's rows, log it, back to the page."""
        source = request.POST if request.method == "POST" else request.GET
        name, word = source.get("part", ""), source.get("verb", "")
        kind, target = source.get("kind", ""), source.get("target", "")
        if name not in self.visible_parts(request):
            raise PermissionDenied
        part = registered()[name](using=self.using())
        verb = next((v for v in failures.verbs(part) if _word(part, v) == word), None)
        if verb is None:
            raise Http404(f"{name} rows that failed cannot be {word!r}-ed")
        if not self._may(request, part, word):
            raise PermissionDenied
        rules = operator.operations(part.model)
        noun = part.model._meta.verbose_name_plural
        page = reverse("admin:django_outbox_health_changelist")
        if request.method == "POST" and source.get("confirmed"):
            done = failures.act(part, verb, kind, target)
            label = f"{kind} at {failures.TARGETS[name]} {target}"
            LogEntry.objects.create(
                user_id=request.user.pk,  # type: ignore[misc]
                content_type_id=ContentType.objects.get_for_model(part.model).pk,
                object_id=None,
                object_repr=label[:200],
                action_flag=CHANGE,
                change_message=(
                    f"{rules.past(verb).capitalize()} {done.moved} of the {done.matched} "
                    f"failed {noun} of the group {label!r} through the health page."
                ),
            )
            said = f"{done.moved} {noun} {rules.past(verb)} ({kind} at {target})."
            self.message_user(request, said, messages.SUCCESS)
            if done.moved < done.matched:
                self.message_user(
                    request,
                    f"{done.matched - done.moved} changed meanwhile and were left as they were.",
                    messages.WARNING,
                )
            if done.more:
                self.message_user(
                    request,
                    f"More {noun} of this group may be left (at most {failures.ACTION_LIMIT:,} "
                    "are moved at a time): run it again.",
                    messages.WARNING,
                )
            return HttpResponseRedirect(page)
        chosen = failures.select(part, kind, target)
        shown = part.model._default_manager.using(part.using).filter(pk__in=chosen.ids[:SHOWN_ROWS])
        context = {
            **self.admin_site.each_context(request),
            "title": f"{word.capitalize()} this group of failed {noun}?",
            "opts": self.model._meta,
            "part": name,
            "word": word,
            "past": rules.past(verb),
            "kind": kind,
            "target": target,
            "target_label": failures.TARGETS[name].replace("_", " "),
            "count": len(chosen.ids),
            "more": chosen.more,
            "limit": failures.ACTION_LIMIT,
            "rows": shown.order_by("-pk"),
            "consequence": _consequence(self._part_admin(name), verb),
            "health_url": page,
        }
        return TemplateResponse(request, "django_outbox/admin/health_group.html", context)

    def using(self) -> str:
        """The database of the page's figures (the worker table's, as routed)."""
        return str(self.model._default_manager.db)

    def _may(self, request: HttpRequest, part: Part, word: str) -> bool:
        """Whether the user holds the permission the part's own *word* action needs."""
        part_admin = self._part_admin(part.name)
        check = getattr(part_admin, f"has_{word}_permission", None)
        if check is not None:
            return bool(check(request))
        meta = part.model._meta
        return request.user.has_perm(f"{meta.app_label}.{word}_{meta.model_name}")


def _word(part: Part, verb: operator.Verb) -> str:
    return operator.operations(part.model).word(verb)


def _consequence(part_admin: Any, verb: operator.Verb) -> str:
    consequences = getattr(part_admin, "consequences", {}) or {}
    return str(consequences.get(verb, ""))


def _list_filters(part: Part, group: failures.FailureGroup) -> dict[str, str]:
    """The part's list, filtered to the group's failed rows as closely as its filters go:
    the failed state and the target; an inbox error's class too (its text starts with it)."""
    query = {"state__exact": part.lifecycle.failed, group.target_field: group.target}
    if part.name == "inbox" and failures.error_kind(group.example) == group.kind:
        query["last_error__startswith"] = group.kind
    return query


def _worker_context(worker: figures.WorkerFigures, now: datetime) -> dict[str, Any]:
    return {
        "worker": worker,
        "stuck": worker.stuck > 0,
        "holds": [
            {"held": held, "for": (now - held.since).total_seconds() if held.since else None}
            for held in worker.holds
        ],
    }


def _refresh(request: HttpRequest) -> int | None:
    try:
        seconds = int(request.GET.get("refresh", ""))
    except ValueError:
        return None
    low, high = REFRESH_RANGE
    return min(max(seconds, low), high)
