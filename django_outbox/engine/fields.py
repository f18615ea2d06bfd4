"""Model fields of the engine's own (no model is defined here: the engine's modules
import it before Django's app registry is ready)."""

from __future__ import annotations

from typing import Any, cast

from django.db import models
from django.db.models.query_utils import DeferredAttribute


class _KeptJSONAttribute(DeferredAttribute):
    """The descriptor of a :class:`KeptJSONField`: a value a claim left as its stored text
    (``<name>_json`` in the instance's ``__dict__``) is decoded on first read. Setting
    the value (code, ``refresh_from_db``) drops the kept text: it would not be the
    value's any more."""

    def __set__(self, instance: Any, value: Any) -> None:
        data = instance.__dict__
        data[self.field.attname] = value
        data.pop(self.field.attname + "_json", None)

    def __get__(self, instance: Any, cls: Any = None) -> Any:
        if instance is not None:
            data = instance.__dict__
            name = self.field.attname
            if name not in data and name + "_json" in data:
                field = cast("KeptJSONField", self.field)
                data[name] = field.decode_text(data[name + "_json"])
        return super().__get__(instance, cls)


class KeptJSONField(models.JSONField):
    """A ``JSONField`` whose value a claim keeps as the text the database returned, and
    decodes only if something reads it: the relay sends the stored text to Redis and
    RabbitMQ and never needs the value, whose decoding grew with the payload's size.

    The text is kept beside the value as ``<name>_json`` (``Envelope.from_message``
    reads it). Such an instance is not deferred to Django (``EngineRow``'s
    ``get_deferred_fields``): ``save()`` writes the field, decoding it first. Declared
    as a plain ``JSONField`` in migrations."""

    descriptor_class = _KeptJSONAttribute

    def decode_text(self, text: Any) -> Any:
        """The value of the stored *text*, as ``from_db_value`` makes it."""
        # Django's reads neither the expression nor the connection for a column's text.
        return self.from_db_value(text, None, None)  # type: ignore[arg-type]

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
