"""tools/docs_check.py, the check that the docs site's API reference holds every public name, on
inventories made here (the docs part of the test session runs it on the real site)."""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path
from typing import Any

import pytest

import accelkit
import accelkit.sdk

ROOT = Path(__file__).resolve().parents[1]


def _load_tool() -> Any:
    path = ROOT / "tools" / "docs_check.py"
    spec = importlib.util.spec_from_file_location("accelkit_docs_check", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_check = _load_tool()


def inventory(names: list[str]) -> bytes:
    """A Sphinx inventory v2 of ``names``, as mkdocstrings writes one."""
    header = (
        b"# Sphinx inventory version 2\n# Project: accelkit\n# Version: 0.0.0\n"
        b"# The remainder of this file is compressed using zlib.\n"
    )
    lines = "".join(f"{name} py:class 1 reference/x/#$ -\n" for name in names)
    return header + zlib.compress(lines.encode())


def everything() -> list[str]:
    return [f"{m.__name__}.{n}" for m in (accelkit, accelkit.sdk) for n in m.__all__]


def test_reads_the_names_of_an_inventory() -> None:
    assert docs_check.inventory_names(inventory(["accelkit.Tensor", "accelkit"])) == {
        "accelkit.Tensor",
        "accelkit",
    }
    with pytest.raises(ValueError, match="not a Sphinx inventory"):
        docs_check.inventory_names(b"<html></html>")


def test_passes_when_every_public_name_is_documented(tmp_path: Path) -> None:
    path = tmp_path / "objects.inv"
    path.write_bytes(inventory(everything()))
    assert docs_check.main(["--inventory", str(path)]) == 0


def test_names_each_missing_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gone = {"accelkit.Selection", "accelkit.workloads", "accelkit.sdk.storage"}
    path = tmp_path / "objects.inv"
    path.write_bytes(inventory([n for n in everything() if n not in gone]))
    assert docs_check.main(["--inventory", str(path)]) == 1
    shown = capsys.readouterr().out
    assert "3 public name(s) missing" in shown
    assert {line.strip() for line in shown.splitlines()} >= gone


def test_a_site_not_built_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docs_check.main(["--inventory", str(tmp_path / "objects.inv")]) == 1
    assert "run mkdocs build first" in capsys.readouterr().out
