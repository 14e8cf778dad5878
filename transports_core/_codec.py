"""Turning events into stored JSON and back, for every backend.

One `EventCodec` per transport wraps a pydantic ``TypeAdapter`` for its ``event_type``: a
model class, or anything ``TypeAdapter`` accepts (a discriminated union of models, say).
Imports only ``_models``, ``_errors`` and ``_validate``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import MethodType
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from ._errors import EventDecodeError
from ._models import Lease, Message
from ._validate import (
    MAX_GROUP_ID,
    MAX_KEY,
    MAX_PRIORITY,
    check_group_id,
    check_hold,
    check_item,
    check_items,
    check_key,
    check_priority,
    check_publish_delay,
    check_tenant,
    no_options,
)

__all__ = ["Claimed", "EventCodec", "Item"]

E = TypeVar("E")


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "event"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid')}{more}"


# What a model's core schema method is bound to when the model keeps pydantic's own.
_OWN_SCHEMA: object = vars(BaseModel)["__get_pydantic_core_schema__"].__func__


def _plain_model(event_type: Any) -> type[BaseModel] | None:
    """``event_type`` if strict validation hands back any instance of it unchanged: a model
    class that does not revalidate instances, with no model validator (pydantic runs
    ``wrap`` and ``after`` ones even on an instance) and pydantic's own core schema. Then ``encode``
    can skip the validation, which costs as much as the serialization."""
    if not (isinstance(event_type, type) and issubclass(event_type, BaseModel)):
        return None
    schema = event_type.__get_pydantic_core_schema__
    plain = (
        event_type.model_config.get("revalidate_instances", "never") == "never"
        and not event_type.__pydantic_decorators__.model_validators
        and isinstance(schema, MethodType)
        and schema.__func__ is _OWN_SCHEMA
    )
    return event_type if plain else None


def _article(name: str) -> str:
    return "an" if name[:1].lower() in "aeiou" else "a"


def _unserialisable(event: object, exc: PydanticSerializationError) -> TypeError:
    """The error for an event that validated but holds a value JSON cannot carry."""
    found = re.search(r"<class '([^']+)'>", str(exc))
    what = found[1].rpartition(".")[2] if found else None
    holds = f"a value of type {what}" if what else "a value"
    return TypeError(
        f"event {event!r:.200} cannot be stored: it holds {holds}, which pydantic cannot "
        f"serialize to JSON ({exc})"
    )


class EventCodec(Generic[E]):
    """Encodes events of one type to JSON text and decodes them back."""

    __slots__ = ("_adapter", "_model", "_to_json", "event_type")

    def __init__(self, event_type: Any) -> None:
        self.event_type = event_type
        try:
            self._adapter: TypeAdapter[E] = TypeAdapter(event_type)
        except Exception as exc:  # pydantic raises several kinds for a type it cannot use
            raise TypeError(
                f"event_type {event_type!r} is not a type pydantic can validate"
            ) from exc
        self._model = _plain_model(event_type)
        # What ``dump_json`` calls with its defaults, without its keyword plumbing (a third
        # of the cost of encoding a small event).
        self._to_json = self._adapter.serializer.to_json

    @property
    def type_name(self) -> str:
        return getattr(self.event_type, "__name__", None) or repr(self.event_type)

    def encode(self, event: object) -> str:
        """Return the JSON to store, or raise ``TypeError`` if ``event`` is not an instance
        of the event type (strict: a dict is not a model)."""
        if self._model is not None and isinstance(event, self._model):
            # What strict validation would return: this very instance (see `_plain_model`).
            return self._dump(event, event)
        try:
            valid = self._adapter.validate_python(event, strict=True)
        except ValidationError as exc:
            raise TypeError(
                f"event {event!r:.200} is not a valid {self.type_name}: {_first_error(exc)}"
            ) from exc
        # pydantic's strict mode still builds a model from a dict (or from a union member's
        # fields); a model instance coming out of something else means the caller did not
        # pass an event of the event type.
        if isinstance(valid, BaseModel) and not isinstance(event, type(valid)):
            raise TypeError(
                f"event {event!r:.200} is not a valid {self.type_name}: "
                f"expected {_article(type(valid).__name__)} {type(valid).__name__} instance, "
                f"got {type(event).__name__}"
            )
        return self._dump(valid, event)

    def _dump(self, valid: object, event: object) -> str:
        try:
            return self._to_json(valid).decode()
        except PydanticSerializationError as exc:
            raise _unserialisable(event, exc) from exc

    def encode_items(self, items: Iterable[tuple[str, E, int] | Message[E]]) -> list[Item]:
        """Check and encode ``publish_many`` items, naming the index of a bad one."""
        encoded: list[Item] = []
        append = encoded.append
        model, to_json = self._model, self._to_json
        for index, item in enumerate(check_items(items)):
            # The common items, checked inline, in one pass: a batch pays these per row.
            if type(item) is tuple and len(item) == 3:
                group_id, event, priority = item
                key = None
            elif type(item) is Message and no_options(item.delay, item.hold, item.tenant):
                group_id, event, priority, key = item.group_id, item.event, item.priority, item.key
            else:
                group_id = None
            # ASCII ids without NUL need no more; any other goes through `encode_item`.
            if (
                type(group_id) is str
                and 0 < len(group_id) <= MAX_GROUP_ID
                and group_id.isascii()
                and "\x00" not in group_id
                and type(priority) is int
                and 0 <= priority <= MAX_PRIORITY
                and type(event) is model
                and (
                    key is None
                    or (
                        type(key) is str
                        and 0 < len(key) <= MAX_KEY
                        and key.isascii()
                        and "\x00" not in key
                    )
                )
            ):
                try:
                    raw = to_json(event).decode()
                except PydanticSerializationError as exc:
                    raise TypeError(f"items[{index}]: {_unserialisable(event, exc)}") from exc
                append(Item(group_id, raw, priority, key, 0.0, False, None))
                continue
            try:
                append(self.encode_item(*check_item(index, item)))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"items[{index}]: {exc}") from exc
        return encoded

    def encode_item(
        self,
        group_id: object,
        event: object,
        priority: object,
        key: object = None,
        delay: object = 0,
        hold: object = False,
        tenant: object = None,
    ) -> Item:
        """Check and encode one publish's arguments (see `Item`)."""
        return Item(
            check_group_id(group_id, publish=True),
            self.encode(event),
            check_priority(priority),
            None if key is None else check_key(key),
            check_publish_delay(delay),
            check_hold(hold),
            None if tenant is None else check_tenant(tenant),
        )

    def lease(
        self, seq: int, group_id: str, raw: str, worker_id: str, attempt: int, expires_at: float
    ) -> Lease[E]:
        """Build the lease for a claimed row, or raise `EventDecodeError` carrying it."""
        try:
            event = self._adapter.validate_json(raw)
        except ValidationError as exc:
            poison = Lease(seq, group_id, raw, worker_id, attempt, expires_at)
            raise EventDecodeError(poison, _first_error(exc)) from exc
        return Lease(seq, group_id, event, worker_id, attempt, expires_at)


class Item(NamedTuple):
    """One publish, checked and encoded: what a backend stores. ``event`` is the JSON
    text; ``delay`` is 0 for a message due at once, and ``hold`` then means nothing;
    ``key`` and ``tenant`` are None when not given."""

    group_id: str
    event: str
    priority: int
    key: str | None
    delay: float
    hold: bool
    tenant: str | None

    @property
    def plain(self) -> bool:
        """No key, delay or tenant: a publish as it was before they existed."""
        return self.key is None and not self.delay and self.tenant is None


class Claimed(NamedTuple):
    """A message a claim leased, as stored: its event still JSON text. A runner returns it
    from the claim's transaction and decodes it with `lease` after the commit, so that an
    event that no longer decodes raises `EventDecodeError` with a lease that is current."""

    seq: int
    group_id: str
    raw: str
    worker_id: str
    attempt: int
    expires_at: float

    def lease(self, codec: EventCodec[E]) -> Lease[E]:
        """The lease, its event decoded by ``codec`` (see `EventCodec.lease`)."""
        return codec.lease(*self)
