"""``transports publish``: put one event, or a stream of JSON lines, on a queue.

One event comes from the command line; without one, standard input is read as JSON
lines, each checked in full before its batch is published with ``publish_many``, so a
bad line stops the run with nothing of its batch written. Backend-neutral: the queue is
opened by URL and used through the `transports_core.Transport` protocol only.

Input is held to JSON, not to what Python's ``json`` takes: ``NaN``, ``Infinity`` and
numbers too large for a float are refused (pydantic would store them as null), and so is
text that UTF-8 cannot carry (an undecodable byte, a lone surrogate), which no store can.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import IO

import click
from pydantic import ValidationError

from transports_core import Duplicate, Event, Message, open_transport
from transports_core.backend import check_group_id, check_key, check_priority

from ._output import count_option, emit_json, url_argument
from .admin import plural

__all__ = ["publish"]

_FIELDS = ("group", "event", "priority", "key")
# A JSON escape of a UTF-16 surrogate: paired, it is one character; alone, it is not text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _BadLine(click.ClickException):
    """A line of standard input that is not a message; its batch was not written."""


def _not_json(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON: a JSON number is finite")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text:.40} is too large for a JSON number (it would be stored as null)")
    return number


def _loads(text: str) -> object:
    """``json.loads`` of ``text``, if it is JSON that a store keeps as it was given: UTF-8
    text, and no ``NaN``, ``Infinity`` or number too large for a float, which Python's
    ``json`` accepts but pydantic writes as null."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"not UTF-8 text (an undecodable byte or a lone surrogate at column {exc.start + 1})"
        ) from None
    try:
        return json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from exc


def _event(value: object, text: str) -> Event:
    """The event of ``value``, parsed by `_loads` from ``text``."""
    if not isinstance(value, dict):
        raise ValueError(f"the event must be a JSON object, got {json.dumps(value)}")
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"the event holds a lone surrogate ({exc.object[exc.start]!r}), "
                "which is not text and cannot be stored"
            ) from None
    try:
        return Event.model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"the event does not validate: {exc}") from exc


def _message(text: str, default_group: str | None) -> Message[Event]:
    """The message on one input line, checked as ``publish`` would check it."""
    fields = _loads(text)
    if not isinstance(fields, dict):
        raise ValueError(f"expected a JSON object with {', '.join(_FIELDS)}")
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; a line has {', '.join(_FIELDS)}")
    if "event" not in fields:
        raise ValueError("no 'event'")
    group = fields.get("group", default_group)
    if group is None:
        raise ValueError("no 'group' (and no GROUP argument to default to)")
    group = check_group_id(group, publish=True)
    priority = check_priority(fields.get("priority", 0))
    key = fields.get("key")
    key = None if key is None else check_key(key)
    return Message(group, _event(fields["event"], text), priority, key)


def _batches(
    lines: IO[str], default_group: str | None, size: int
) -> Iterator[list[Message[Event]]]:
    batch: list[Message[Event]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            batch.append(_message(line, default_group))
        except (ValueError, TypeError) as exc:
            raise _BadLine(f"line {number} of standard input: {exc}") from exc
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


@click.command(short_help="Publish one event, or JSON lines from standard input.")
@url_argument()
@click.argument("group", required=False)
@click.argument("event_json", metavar="[EVENT]", required=False)
@count_option(
    "--priority", 0, 4, "The group's priority (one event; it applies to a new group).", default=0
)
@click.option("--key", default=None, help="Idempotency key (one event).")
@count_option(
    "--batch", 1, 100_000, "Lines published per publish_many (standard input).", default=500
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def publish(
    url: str,
    group: str | None,
    event_json: str | None,
    priority: int,
    key: str | None,
    batch: int,
    as_json: bool,
) -> None:
    """Publish EVENT (a JSON object) to GROUP of the queue at URL and print its seq.

    Without EVENT, read standard input as JSON lines, one message each:

    \b
      {"group": "order-17", "event": {...}, "priority": 2, "key": "k-1"}

    ("priority" and "key" are optional; "group" too when GROUP is given, which it
    then defaults to) and publish them in batches of --batch with publish_many, each
    batch atomically. A line that is not such a message stops the run with an error
    naming its line number; the batches before it stay published, its own is not
    written. Prints how many were published, and how many were duplicates (a key
    already used in its group).

    \b
    Example:
      transports publish sqlite:///queue.db order-17 '{"step": 1}'
      transports publish sqlite:///queue.db < messages.jsonl
      TRANSPORTS_URL=sqlite:///queue.db transports publish order-17 '{"step": 2}'
    """
    if event_json is not None:
        assert group is not None  # click fills GROUP before EVENT
        try:
            event = _event(_loads(event_json), event_json)
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="EVENT") from exc
        with open_transport(url) as transport:
            seq = transport.publish(group, event, priority, key=key)
        duplicate = isinstance(seq, Duplicate)
        if as_json:
            emit_json({"seq": int(seq), "duplicate": duplicate})
        elif duplicate:
            click.echo(f"Duplicate: key {key!r} was used in group {group!r} by seq {int(seq)}")
        else:
            click.echo(f"Published seq {seq} to group {group!r}")
        return
    if key is not None or priority:
        raise click.UsageError("--priority and --key apply to one EVENT; lines carry their own")
    if sys.stdin.isatty():
        click.echo("Reading JSON lines from standard input (end with Ctrl-D)", err=True)
    published = duplicates = 0
    with open_transport(url) as transport:
        for items in _batches(sys.stdin, group, batch):
            seqs = transport.publish_many(items)
            duplicates += sum(isinstance(s, Duplicate) for s in seqs)
            published += len(seqs) - sum(isinstance(s, Duplicate) for s in seqs)
    if as_json:
        emit_json({"published": published, "duplicates": duplicates})
        return
    skipped = f" ({plural(duplicates, 'duplicate')} skipped)" if duplicates else ""
    click.echo(f"Published {plural(published, 'event')}{skipped}")
