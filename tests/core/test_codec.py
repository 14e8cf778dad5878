"""Events to stored JSON and back: the event type decides what is accepted, including a
discriminated union of models. (The union's round trip through each backend is the
conformance suite's ``event-type-round-trip``; its models serve here too.)"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from transports_core import Event, EventDecodeError, Message
from transports_core._codec import EventCodec
from transports_core.conformance._edges import OrderEvent, Placed, Refunded


class Shipped(BaseModel):
    order_id: int


def test_union_event_type_encodes_each_kind_and_decodes_it_as_its_model() -> None:
    codec: EventCodec[Any] = EventCodec(OrderEvent)
    events = [Placed(order=1), Refunded(order=1, cents=250)]
    leases = [codec.lease(n, "o", codec.encode(e), "w", 1, 0.0) for n, e in enumerate(events)]
    assert [(type(x.event), x.event) for x in leases] == [(type(e), e) for e in events]


def test_union_event_type_refuses_a_model_outside_the_union() -> None:
    codec: EventCodec[Any] = EventCodec(OrderEvent)
    with pytest.raises(TypeError, match=r"event Shipped\(order_id=1\) is not a valid"):
        codec.encode(Shipped(order_id=1))
    with pytest.raises(TypeError, match="expected a Placed instance, got dict"):
        codec.encode({"kind": "placed", "order": 1})


@pytest.mark.parametrize(
    ("event", "names"),
    [
        (Event(order_id=1), "event Event(order_id=1) is not a valid Shipped"),
        ({"order_id": 1}, "event {'order_id': 1} is not a valid Shipped"),
        ("order 1", "event 'order 1' is not a valid Shipped"),
        (None, "event None is not a valid Shipped"),
    ],
)
def test_event_of_the_wrong_type_is_a_type_error_naming_it(event: object, names: str) -> None:
    with pytest.raises(TypeError) as info:
        EventCodec(Shipped).encode(event)
    assert names in str(info.value)


def test_subclass_instance_of_the_event_type_is_accepted() -> None:
    class Express(Shipped):
        pass

    assert EventCodec(Shipped).encode(Express(order_id=4)) == '{"order_id":4}'


def test_default_event_type_keeps_any_fields() -> None:
    codec: EventCodec[Event] = EventCodec(Event)
    raw = codec.encode(Event(kind="x", n=[1, 2]))
    assert raw == '{"kind":"x","n":[1,2]}'
    assert codec.lease(1, "g", raw, "w", 1, 0.0).event == Event(kind="x", n=[1, 2])


def test_non_model_event_types_work_too() -> None:
    codec: EventCodec[Any] = EventCodec(dict[str, int])
    assert codec.encode({"a": 1}) == '{"a":1}'
    with pytest.raises(TypeError, match="not a valid"):
        codec.encode({"a": "1"})  # strict: no string-to-int coercion


def test_event_type_pydantic_cannot_use_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="event_type 42 is not a type pydantic can validate"):
        EventCodec(42)


def test_stored_json_that_does_not_decode_raises_with_the_raw_text() -> None:
    codec: EventCodec[Shipped] = EventCodec(Shipped)
    with pytest.raises(EventDecodeError, match="order_id: Field required") as info:
        codec.lease(9, "g", '{"id": 1}', "w", 2, 5.0)
    assert info.value.raw == '{"id": 1}'
    assert (info.value.lease.seq, info.value.lease.attempt) == (9, 2)


# A model instance is encoded without validating it again only where pydantic would hand
# the same instance back; these models tell the two paths apart.


class Positive(BaseModel):
    model_config = ConfigDict(revalidate_instances="always")
    n: int

    @field_validator("n")
    @classmethod
    def _positive(cls, n: int) -> int:
        if n <= 0:
            raise ValueError("n must be positive")
        return n


class Checked(BaseModel):
    n: int

    @model_validator(mode="after")
    def _not_negative(self) -> Checked:  # pydantic runs it on instances too
        if self.n < 0:
            raise ValueError("n must not be negative")
        return self


@pytest.mark.parametrize("model", [Positive, Checked])
def test_instances_are_validated_again_when_the_event_type_asks_for_it(
    model: type[BaseModel],
) -> None:
    bad = model.model_construct(n=-1)  # skips validation, as a mutated model would
    with pytest.raises(TypeError, match="must"):
        EventCodec(model).encode(bad)
    assert EventCodec(model).encode(model(n=3)) == '{"n":3}'


def test_a_dict_is_refused_for_a_plain_model_event_type() -> None:
    with pytest.raises(TypeError, match="expected a Shipped instance, got dict"):
        EventCodec(Shipped).encode({"order_id": 1})


class Loud(Shipped):
    pass


def test_a_batch_encodes_each_item_as_encode_would_whichever_path_it_takes() -> None:
    codec: EventCodec[Shipped] = EventCodec(Shipped)
    items: list[tuple[str, Any, int] | Message[Any]] = [
        ("g", Shipped(order_id=1), 0),  # the common item, checked inline
        ("h", Loud(order_id=2), 4),  # a subclass: the general path
        ("g", Shipped(order_id=3), 2),
        Message("g", Shipped(order_id=4), 1, key="k-4"),  # a message, checked inline
        Message("h", Loud(order_id=5), key="k-5"),  # a message, the general path
        Message("g", Shipped(order_id=6), delay=2.5, hold=True, tenant="t"),  # options
    ]
    assert codec.encode_items(items) == [
        ("g", codec.encode(Shipped(order_id=1)), 0, None, 0, False, None),
        ("h", codec.encode(Loud(order_id=2)), 4, None, 0, False, None),
        ("g", codec.encode(Shipped(order_id=3)), 2, None, 0, False, None),
        ("g", codec.encode(Shipped(order_id=4)), 1, "k-4", 0, False, None),
        ("h", codec.encode(Loud(order_id=5)), 0, "k-5", 0, False, None),
        ("g", codec.encode(Shipped(order_id=6)), 0, None, 2.5, True, "t"),
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (("", Shipped(order_id=1), 0), r"items\[1\]: group_id must not be empty"),
        (("g", Shipped(order_id=1), True), r"items\[1\]: priority must be an int"),
        (("g", Shipped(order_id=1), 5), r"items\[1\]: priority must be from 0 to 4"),
        (("g", Placed(order=1), 0), r"items\[1\]: event .* is not a valid Shipped"),
        (Message("g", Shipped(order_id=1), key=""), r"items\[1\]: key must be 1 to 255"),
        (Message("g", Shipped(order_id=1), key="k" * 256), r"items\[1\]: key must be 1 to 255"),
        (
            Message("g", Shipped(order_id=1), key=7),  # type: ignore[arg-type]
            r"items\[1\]: key must be a str or None",
        ),
        (Message("g", Shipped(order_id=1), delay=-1), r"items\[1\]: delay must be >= 0"),
        (Message("g", Shipped(order_id=1), delay=4e7), r"items\[1\]: delay must be at most"),
        (
            Message("g", Shipped(order_id=1), delay=1, hold=1),  # type: ignore[arg-type]
            r"items\[1\]: hold must be a bool",
        ),
        (Message("g", Shipped(order_id=1), tenant=""), r"items\[1\]: tenant must be 1 to 255"),
        (("g", Shipped(order_id=1), 0, "k"), r"items\[1\] must be a Message or a \(group_id"),
        # Text no store can write, on the inline path (a triple, a plain message) and off it.
        (("g" * 513, Shipped(order_id=1), 0), r"items\[1\]: group_id must be at most 512"),
        (("a\x00b", Shipped(order_id=1), 0), r"items\[1\]: group_id must not contain a NUL"),
        (("g\ud800", Shipped(order_id=1), 0), r"items\[1\]: group_id must be Unicode text"),
        (("é" * 513, Shipped(order_id=1), 0), r"items\[1\]: group_id must be at most 512"),
        (Message("g", Shipped(order_id=1), key="k\x00"), r"items\[1\]: key must not contain"),
        (Message("g", Shipped(order_id=1), key="k\udc80"), r"items\[1\]: key must be Unicode"),
        (
            Message("g\x00", Shipped(order_id=1), delay=1),
            r"items\[1\]: group_id must not contain a NUL",
        ),
        (Message("g", Shipped(order_id=1), tenant="t\x00"), r"items\[1\]: tenant must not"),
    ],
)
def test_a_bad_item_in_a_batch_is_named_by_its_index(item: Any, message: str) -> None:
    codec: EventCodec[Shipped] = EventCodec(Shipped)
    with pytest.raises((TypeError, ValueError), match=message):
        codec.encode_items([("g", Shipped(order_id=0), 0), item])


def test_a_batch_takes_group_ids_of_512_characters_of_any_text() -> None:
    codec: EventCodec[Shipped] = EventCodec(Shipped)
    items: list[tuple[str, Any, int] | Message[Any]] = [
        ("g" * 512, Shipped(order_id=1), 0),
        ("ü" * 512, Shipped(order_id=2), 0),
        Message("\U0001f600" * 512, Shipped(order_id=3), key="ключ"),
    ]
    assert [item.group_id for item in codec.encode_items(items)] == [
        "g" * 512,
        "ü" * 512,
        "\U0001f600" * 512,
    ]
