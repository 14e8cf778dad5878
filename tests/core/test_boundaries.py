"""No package of this repository imports a private module of another: a backend, the CLI
and the worker use core's public names (``transports_core``, ``transports_core.backend``),
as a third party's code would have to."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = sorted(p.name for p in ROOT.glob("transports_*") if (p / "__init__.py").exists())


def _private(part: str) -> bool:
    return part.startswith("_") and not part.endswith("__")  # `__main__` is no secret


def _private_imports(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top, *rest = name.split(".")
                if top != package and top in PACKAGES and any(_private(p) for p in rest):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_the_repository_has_the_packages_this_test_reads() -> None:
    assert {"transports_core", "transports_sqlite", "transports_cli"} <= set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_no_private_module_of_another(package: str) -> None:
    assert _private_imports(package) == []


def test_the_check_finds_a_private_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "transports_fake"
    fake.mkdir()
    (fake / "__init__.py").write_text("from transports_core._codec import EventCodec\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    monkeypatch.setattr(f"{__name__}.PACKAGES", ["transports_core", "transports_fake"])
    assert _private_imports("transports_fake") == [
        "transports_fake/__init__.py:1: transports_core._codec"
    ]
