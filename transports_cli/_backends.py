"""``transports backends``: the URL schemes that resolve here, and where each comes from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib.metadata import EntryPoint, entry_points

import click

from transports_core import ENTRY_POINT_GROUP, Backend, known_schemes

from ._output import emit_json, print_table

__all__ = ["backends"]


@dataclass(frozen=True)
class BackendInfo:
    scheme: str
    origin: str
    distribution: str | None
    version: str | None
    sync: bool
    async_: bool
    error: str | None


def _describe(scheme: str, origin: str, ep: EntryPoint | None) -> BackendInfo:
    dist = ep.dist if ep is not None else None
    name = dist.name if dist is not None else None
    version = dist.version if dist is not None else None
    if ep is None:  # registered in process; nothing to load
        return BackendInfo(scheme, origin, name, version, True, False, None)
    try:
        # Loading imports the backend module (and its driver): the only honest way to
        # learn whether it works here, and what it offers.
        loaded = ep.load()
    except Exception as exc:  # a missing optional dependency names its extra
        return BackendInfo(scheme, origin, name, version, False, False, str(exc))
    if not isinstance(loaded, Backend):
        return BackendInfo(
            scheme, origin, name, version, False, False, f"not a Backend: {loaded!r:.60}"
        )
    return BackendInfo(scheme, origin, name, version, True, loaded.open_async is not None, None)


def _as_json(info: BackendInfo) -> dict[str, object]:
    fields = asdict(info)
    fields["async"] = fields.pop("async_")
    fields["error"] = fields.pop("error")  # last, as in the table
    return fields


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def backends(as_json: bool) -> None:
    """List the registered URL schemes and where each comes from.

    A scheme comes from an installed distribution's entry point (group
    durable_transports.backends) or from register_backend() in this process. Each
    backend is loaded to tell whether it works here and has an asyncio twin.

    \b
    Example:
      transports backends
      transports backends --json
    """
    points = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    found = [
        _describe(scheme, origin, points.get(scheme)) for scheme, origin in known_schemes().items()
    ]
    if as_json:
        emit_json([_as_json(b) for b in found])
        return
    print_table(
        ["scheme", "origin", "distribution", "async", "status"],
        [
            [
                b.scheme,
                b.origin,
                f"{b.distribution} {b.version}" if b.distribution else "-",
                "yes" if b.async_ else "no",
                f"unavailable: {b.error}" if b.error else "ok",
            ]
            for b in found
        ],
        empty="No backends registered.",
    )
