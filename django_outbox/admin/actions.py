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
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.functional import cached_property

from django_outbox.admin import bulk
from django_outbox.admin.shared import count_within_budget
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
    #: Further states whose rows it acts on without moving them (a cancel asks running
    #: jobs to stop).
    reaches: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name.capitalize()

    @property
    def touches(self) -> tuple[str, ...]:
        """Every state whose rows it acts on."""
        return (*self.allowed, *self.reaches)


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
        running = operator.part_class(model).lifecycle.running
        asks = verb is Verb.CANCEL and rules.stop_field is not None and running is not None
        actions[word] = Action(
            name=word,
            past=rules.past(verb),
            allowed=allowed,
            apply=partial(operator.act, verb),
            final=verb is not Verb.REQUEUE,
            consequence=consequences.get(verb, ""),
            reaches=(str(running),) if asks else (),
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

    def response_action(
        self: Any, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Django's, for a list action the user may take on selected row ids: a forged id
        that is not one is a 400 (Django's ``pk__in`` filter raised a 500). Django 6.1's
        ``action_location`` goes through untouched."""
        if request.POST.get("action") in self.get_actions(request):
            selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
            if any(row_id(value) is None for value in selected):
                raise BadRequest("the selected rows must be given by their row ids")
        return super().response_action(request, queryset, *args, **kwargs)  # type: ignore[misc]

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
        *confirmed*). Records each row moved in the admin's history; a selection of more
        than ``bulk.BULK_ROWS`` rows moves in steps, recorded once (``admin.bulk``)."""
        action = self.operator_actions[name]
        confirmed = confirmed or bool(request.POST.get("confirmed"))
        large = "bulk_after" in request.POST or (
            queryset.order_by()[: bulk.BULK_ROWS + 1].count() > bulk.BULK_ROWS
        )
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
                    "count": count_within_budget(queryset.order_by())
                    if large
                    else queryset.count(),
                    "large": large,
                    "described": bulk.described(request),
                    "action": request.POST.get("action", ""),
                    "select_across": request.POST.get("select_across", ""),
                    "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
                    "opts": self.model._meta,
                },
            )
        if large:
            stepped: HttpResponse | None = self.operate_in_steps(request, queryset, action)
            return stepped
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

    def operate_in_steps(
        self: Any, request: HttpRequest, queryset: QuerySet[Any], action: Action
    ) -> HttpResponse | None:
        """One step of *action* on a large selection (``admin.bulk``): rows past the row
        id the last step reached, for ``bulk.STEP_SECONDS``; then the progress page, or,
        once done, the list with what moved. One history entry, updated each step."""
        post = request.POST
        first = "bulk_after" not in post
        total = (
            count_within_budget(queryset.filter(state__in=action.touches).order_by())
            if first
            else bulk.carried(post, "bulk_total") or None
        )
        done = bulk.step(
            action.apply,
            queryset.filter(state__in=action.touches),
            after=bulk.carried(post, "bulk_after"),
        )
        moved = bulk.carried(post, "bulk_moved") + done.moved
        stopping = bulk.carried(post, "bulk_stopping") + done.stopping
        noun = f"{self.operator_noun}(s)"
        what = bulk.described(request)
        of = f" of {total:,}" if total else ""
        said = f"{action.past.capitalize()} {moved:,}{of} selected {noun} (list: {what})"
        if stopping:
            said += f"; {stopping:,} running {noun} asked to stop"
        ended = done.after is None
        history = f"{said} through the admin, in steps{'' if ended else '; still going'}."
        entry = self.log_bulk_change(request, queryset.db, post, history, what)
        if not ended:
            return TemplateResponse(
                request,
                "django_outbox/admin/bulk_progress.html",
                {
                    **self.admin_site.each_context(request),
                    "title": f"{action.label}: {moved:,}{of} so far",
                    "said": said,
                    "seconds": f"{bulk.STEP_SECONDS:g}",
                    "states": ", ".join(str(state) for state in action.allowed),
                    "carry": {
                        "action": post.get("action", ""),
                        "select_across": post.get("select_across", ""),
                        "confirmed": "yes",
                        "bulk_after": done.after,
                        "bulk_total": total or 0,
                        "bulk_moved": moved,
                        "bulk_stopping": stopping,
                        "bulk_entry": entry,
                    },
                    "selected": post.getlist(ACTION_CHECKBOX_NAME),
                    "opts": self.model._meta,
                },
            )
        self.message_user(request, f"{said}.", messages.SUCCESS)
        left = (total or 0) - moved - stopping
        if left > 0:
            states = ", ".join(str(s) for s in action.allowed)
            self.message_user(
                request,
                f"{left:,} {noun} left as they were: only those in {states} can be {action.past}.",
                messages.WARNING,
            )
        return None

    def log_bulk_change(
        self: Any, request: HttpRequest, using: str, post: Any, message: str, what: str
    ) -> int:
        """The one history entry of a bulk action: made by its first step, updated by the
        next ones (the entry the progress page carries, if it is this user's)."""
        content_type = ContentType.objects.db_manager(using).get_for_model(self.model)
        entry_id = bulk.carried(post, "bulk_entry")
        if entry_id:
            updated = LogEntry.objects.filter(
                pk=entry_id,
                user_id=request.user.pk,  # type: ignore[misc]
                content_type=content_type,
            ).update(change_message=message)
            if updated:
                return entry_id
        entry = LogEntry.objects.create(
            user_id=request.user.pk,  # type: ignore[misc]
            content_type=content_type,
            object_id=None,
            object_repr=f"{self.model._meta.verbose_name_plural}: {what}"[:200],
            action_flag=CHANGE,
            change_message=message,
        )
        return int(entry.pk)

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
