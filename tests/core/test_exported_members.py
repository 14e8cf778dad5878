"""``__all__`` is the public API of each package: sorted, importable, and complete (after
httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import importlib
import inspect
import typing
from types import ModuleType
from typing import Any

import pytest

PACKAGES = [
    "transports_core",
    "transports_core.backend",
    "transports_postgres",
    "transports_redis",
    "transports_sqlite",
    "transports_worker",
]


def _sort_key(name: str) -> tuple[int, str]:
    """isort's order (ruff's RUF022): CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def _is_alias(value: object) -> bool:
    """A type alias (``Callable[..., T]``), which on Python 3.10 passes `inspect.isclass`
    and says it comes from collections.abc."""
    return typing.get_origin(value) is not None


def _defined_elsewhere(value: object, package: str) -> bool:
    """A class or function imported into ``package`` from outside it (typing.Any, say)."""
    if _is_alias(value) or not (inspect.isclass(value) or inspect.isroutine(value)):
        return False
    root = package.partition(".")[0]
    return str(getattr(value, "__module__", "")).partition(".")[0] != root


@pytest.fixture(params=PACKAGES)
def package(request: pytest.FixtureRequest) -> ModuleType:
    return importlib.import_module(request.param)


def test_all_is_sorted(package: ModuleType) -> None:
    assert package.__all__ == sorted(package.__all__, key=_sort_key)
    assert len(set(package.__all__)) == len(package.__all__)


def test_every_name_in_all_is_importable(package: ModuleType) -> None:
    for name in package.__all__:
        exec(f"from {package.__name__} import {name}", {})


def test_every_public_name_is_exported(package: ModuleType) -> None:
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and type(value).__module__ != "__future__"  # `from __future__ import annotations`
        and value is not Any  # an instance, not a class, on Python 3.10
        and not _defined_elsewhere(value, package.__name__)
        and name != "TYPE_CHECKING"
    }
    # Names exported lazily (a module __getattr__, so that an optional extra is imported
    # only when asked for) are not in the module's namespace until then.
    lazy = {name for name in package.__all__ if name not in vars(package)}
    assert public == set(package.__all__) - lazy


def test_exported_classes_and_functions_say_where_they_come_from(package: ModuleType) -> None:
    for name in package.__all__:
        value = getattr(package, name)
        if (inspect.isclass(value) or inspect.isfunction(value)) and not _is_alias(value):
            root = package.__name__.partition(".")[0]
            assert value.__module__.startswith(f"{root}._"), name
            assert value.__doc__, f"{package.__name__}.{name} has no docstring"
