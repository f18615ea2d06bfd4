"""Operator actions in the admin: the engine's (``engine.operator``) requeue / retry,
cancel and skip, plus a part's own, offered as list actions and as buttons on a row's
page. Each is filtered to its source states by the engine, guarded by a permission of
its own, recorded in the admin's history, and asks first when it cannot be undone."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property

from django_outbox.engine import operator
from django_outbox.engine.operator import Verb

#: The largest primary key a row can have (the tables' ids are 64-bit signed integers).
MAX_ROW_ID = 2**63 - 1


def row_id(text: str) -> int | None:
    """The row id *text* spells, written as the admin writes one (ASCII digits, no sign,
    no leading zero, no spaces, at most ``MAX_ROW_ID``), else ``None``: ``int()`` would
    take ``" 1"``, ``"+1"``, ``"1_0"`` or Arabic-Indic digits, and a number past 64 bits
    fails in the database instead of finding nothing."""
    if not (text.isascii() and text.isdigit()) or text.startswith("0"):
        return None
    value = int(text)
    return value if value <= MAX_ROW_ID else None


@dataclass(frozen=True)
class Action:
    """An operator action as the admin offers it: a list action, and a button on the
    page of a row it applies to."""

    #: The part's word for it: ``requeue``, ``retry``, ``cancel``, ``skip``…
    name: str
    #: Its past participle, for messages and the history.
    past: str
    #: States it moves rows from (other selected rows are left as they were).
    allowed: tuple[str, ...]
    #: The domain call: moves what it may of a queryset and says what it moved.
    apply: Callable[[QuerySet[Any]], operator.Moved]
    #: A final action asks first, saying what cannot be undone.
    final: bool = False
    consequence: str = ""
    #: Whether a row's page offers it as a button.
    on_page: bool = True
    #: The permission it needs (``has_<permission>_permission``; default: its name).
    permission: str = ""

    @property
    def label(self) -> str:
        return self.name.capitalize()


def engine_actions(model: type[Any], consequences: Mapping[Verb, str]) -> dict[str, Action]:
    """The engine's operator actions on *model*'s part (``engine.operator``), in the part's
    words; those that cannot be undone (cancel, skip) ask first, saying *consequences*."""
    rules = operator.operations(model)
    actions = {}
    for verb in Verb:
        allowed = operator.sources(model, verb)
        if not allowed:
            continue
        word = rules.word(verb)
        actions[word] = Action(
            name=word,
            past=rules.past(verb),
            allowed=allowed,
            apply=partial(operator.act, verb),
            final=verb is not Verb.REQUEUE,
            consequence=consequences.get(verb, ""),
        )
    return actions


class OperatorActions:
    """Requeue / retry / cancel / skip for a part's ModelAdmin, on the list and on a row's
    page: filtered to the allowed source states by the engine, guarded by a permission
    each, logged in the admin's history, final ones confirmed first."""

    #: What the rows are called in messages to the operator.
    operator_noun = "message"
    #: The engine part whose sweep the changelist reports on.
    part_name = ""
    #: What an operator is told before a final action (cancel, skip), by verb.
    consequences: Mapping[Verb, str] = {}
    #: Actions of the part's own, besides the engine's.
    own_actions: Mapping[str, Action] = {}

    @cached_property
    def operator_actions(self: Any) -> dict[str, Action]:
        """The part's actions by name: the engine's, then its own. Read on first use: the
        engine knows the parts once the app is ready, after the admin was imported."""
        return {**engine_actions(self.model, self.consequences), **self.own_actions}

    def changelist_view(
        self: Any, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list, with a warning at the top when the part's sweeps have stopped."""
        from django_outbox.engine.sweeps import stale_sweeps

        if request.method == "GET":
            for found in stale_sweeps(self.model._default_manager.db):
                if found.part == self.part_name:
                    self.message_user(request, found.describe(), messages.WARNING)
        return super().changelist_view(request, extra_context)  # type: ignore[misc,no-any-return]

    def response_action(self: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        """Django's, for a list action the user may take on selected row ids: a forged id
        that is not one is a 400 (Django's ``pk__in`` filter raised a 500)."""
        if request.POST.get("action") in self.get_actions(request):
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            if any(row_id(value) is None for value in selected):
                raise BadRequest("the selected rows must be given by their row ids")
        return super().response_action(request, queryset)  # type: ignore[misc]

    def state_actions(self) -> dict[str, list[str]]:
        """Every state of the rows, with the actions an operator may take from it."""
        states = self.model._meta.get_field("state").choices  # type: ignore[attr-defined]
        return {
            str(state): [name for name, a in self.operator_actions.items() if state in a.allowed]
            for state, _ in states
        }

    def has_action_permission(self: Any, request: HttpRequest, action: Action) -> bool:
        check = getattr(self, f"has_{action.permission or action.name}_permission")
        return bool(check(request))

    def operate(
        self: Any,
        request: HttpRequest,
        queryset: QuerySet[Any],
        name: str,
        *,
        confirmed: bool = False,
    ) -> HttpResponse | None:
        """Apply the action *name* to *queryset*; a final one asks first (unless
        *confirmed*). Records each row moved in the admin's history."""
        action = self.operator_actions[name]
        confirmed = confirmed or bool(request.POST.get("confirmed"))
        if action.final and not confirmed:
            return TemplateResponse(
                request,
                "django_outbox/admin/confirm_action.html",
                {
                    **self.admin_site.each_context(request),
                    "title": f"Are you sure you want to {action.name} these?",
                    "verb": action.name,
                    "past": action.past,
                    "consequence": action.consequence,
                    "objects": queryset[:100],
                    "count": queryset.count(),
                    "action": request.POST.get("action", ""),
                    "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                    "opts": self.model._meta,
                },
            )
        selected = queryset.count()
        moved = action.apply(queryset.order_by())
        self.log_operator_change(request, queryset.db, moved.ids, f"{action.past.capitalize()}")
        self.log_operator_change(request, queryset.db, moved.stopping, "Asked to stop")
        noun = self.operator_noun
        self.message_user(request, f"{moved.count} {noun}(s) {action.past}.", messages.SUCCESS)
        if moved.stopping:
            self.message_user(
                request,
                f"{len(moved.stopping)} running {noun}(s) asked to stop.",
                messages.SUCCESS,
            )
        left = selected - moved.count - len(moved.stopping)
        if left > 0:
            states = ", ".join(str(s) for s in action.allowed)
            self.message_user(
                request,
                f"{left} {noun}(s) left as they were: only those in {states} can be {action.past}.",
                messages.WARNING,
            )
        return None

    def log_operator_change(
        self: Any, request: HttpRequest, using: str, ids: Sequence[Any], what: str
    ) -> None:
        if ids:
            LogEntry.objects.log_actions(
                user_id=request.user.pk,  # type: ignore[arg-type]
                queryset=self.model._default_manager.using(using).filter(pk__in=list(ids)),
                action_flag=CHANGE,
                change_message=f"{what} through the admin.",
            )

    # -- a row's own page ------------------------------------------------------------

    def get_urls(self: Any) -> list[Any]:
        """One URL per action on a row's page (``…/<id>/<action>/``): a POST applies it, a
        GET of a final one asks first."""
        meta = self.model._meta
        own = [
            path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(self._page_action(name)),
                name=f"{meta.app_label}_{meta.model_name}_{name}",
            )
            for name, action in self.operator_actions.items()
            if action.on_page
        ]
        return own + super().get_urls()  # type: ignore[misc,no-any-return]

    def _page_action(self: Any, name: str) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            response: HttpResponse = self.act_on_one(request, object_id, name)
            return response

        return view

    def act_on_one(self: Any, request: HttpRequest, object_id: str, name: str) -> HttpResponse:
        action = self.operator_actions[name]
        # The permissions first, with the same answer for any id: a user who may not act
        # learns nothing, not even which rows exist. Acting needs the list's permission
        # too (view), as the list's actions do.
        if not (
            self.has_view_or_change_permission(request)
            and self.has_action_permission(request, action)
        ):
            raise PermissionDenied
        meta = self.model._meta
        pk = row_id(unquote(object_id))
        obj = None if pk is None else self.get_object(request, str(pk))
        if obj is None:
            # One answer for a malformed id and a missing row.
            raise Http404(f"No {meta.verbose_name} has this id.")
        page = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
        if request.method != "POST":
            if not action.final:
                return HttpResponseRedirect(page)
            return TemplateResponse(
                request,
                "django_outbox/admin/confirm_one.html",
                {
                    **self.admin_site.each_context(request),
                    "title": f"{action.label} this {meta.verbose_name}?",
                    "object": obj,
                    "verb": action.name,
                    "consequence": action.consequence,
                    "change_url": page,
                    "opts": meta,
                },
            )
        # The confirmation, where one is needed, was the page that posted here.
        self.operate(request, self.get_queryset(request).filter(pk=obj.pk), name, confirmed=True)
        return HttpResponseRedirect(page)

    def change_view(
        self: Any,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The row's page, with a button for each action its state allows and the operator
        may take."""
        buttons = []
        # Django's own view refuses a user without the view permission: nothing is read.
        obj = None
        if self.has_view_or_change_permission(request):
            obj = self.get_object(request, unquote(object_id))
        if obj is not None:
            meta = self.model._meta
            for name, action in self.operator_actions.items():
                if not action.on_page or obj.state not in action.allowed:
                    continue
                if not self.has_action_permission(request, action):
                    continue
                url = reverse(f"admin:{meta.app_label}_{meta.model_name}_{name}", args=[obj.pk])
                buttons.append({"label": action.label, "url": url, "final": action.final})
        context = {**(extra_context or {}), "operator_buttons": buttons}
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc,no-any-return]
