"""An event that validates but holds a value JSON cannot carry is refused with the
library's TypeError naming the value's type, not pydantic's own serialization error; and
the messages about a wrong event read as English ("an Event")."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_core import PydanticSerializationError

from transports_core import Event, Message, TransportAdmin, open_transport


class Opaque:
    pass


def test_publish_of_an_unserialisable_event_raises_type_error_naming_the_type(
    tmp_path: Path,
) -> None:
    with open_transport(f"sqlite:///{tmp_path / 'q.db'}") as queue:
        with pytest.raises(TypeError, match="holds a value of type Opaque") as caught:
            queue.publish("g", Event(thing=Opaque()))
        assert type(caught.value) is TypeError
        assert isinstance(caught.value.__cause__, PydanticSerializationError)
        with pytest.raises(TypeError, match=r"items\[1\]: .*a value of type Opaque"):
            queue.publish_many([Message("g", Event(n=1)), ("g", Event(thing=Opaque()), 0)])
        assert isinstance(queue, TransportAdmin)
        assert queue.stats().ready == 0  # the batch was refused whole


def test_a_dict_for_an_event_says_an_event(tmp_path: Path) -> None:
    with (
        open_transport(f"sqlite:///{tmp_path / 'q.db'}") as queue,
        pytest.raises(TypeError, match="expected an Event instance, got dict"),
    ):
        queue.publish("g", {"n": 1})  # type: ignore[arg-type]
