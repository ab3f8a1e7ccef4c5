"""Plugins are written against the public SDK: no plugin in this repository imports accelkit's
private modules (``accelkit._core``) or another backend's modules (``accelkit.backends`` or a
sibling plugin), so a refactor of the core cannot break them, and reaches tensors only through
their public properties and ``accelkit.sdk``'s tensor functions (``storage``, ``view_of``,
``last_writer``, ``mark_written``...), never their private slots. The example backend that
docs/plugins.md walks through is held to the same."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Every device plugin's package (the test plugins under tests/plugins extend the CPU backend on
#: purpose, for registry, fallback and doctor tests, and are not held to this).
PLUGIN_SOURCES = sorted(ROOT.glob("plugins/*/src/*"))
#: The example backend distribution, written only against accelkit.sdk and the public API.
EXAMPLE = ROOT / "tests" / "plugins" / "accelkit-example" / "src" / "accelkit_example"
#: A Tensor's private slots (``accelkit.tensor.Tensor.__slots__``).
TENSOR_SLOTS = {
    "_backend", "_buffer", "_data", "_device", "_dtype", "_seq", "_shape", "_size", "_stream",
}  # fmt: skip
#: A plugin's own attribute of the same name as a slot, read on another object of its class.


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _forbidden(module: str, own: str) -> str | None:
    if module == "accelkit._core" or module.startswith("accelkit._core."):
        return "accelkit._core is private; import what a backend needs from accelkit.sdk"
    if module == "accelkit.backends" or module.startswith("accelkit.backends."):
        return "another backend's modules; import from accelkit.sdk"
    top = module.split(".")[0]
    if top.startswith("accelkit_") and top != own:
        return f"another plugin's package ({top})"
    return None


@pytest.mark.parametrize("package", [*PLUGIN_SOURCES, EXAMPLE], ids=lambda p: p.name)
def test_a_plugin_imports_only_the_public_api(package: Path) -> None:
    assert package.is_dir(), package
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {module}: {why}"
        for path in sorted(package.rglob("*.py"))
        for line, module in _imports(path)
        if (why := _forbidden(module, package.name))
    ]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from accelkit._core.pool import CachingPool\nimport accelkit.backends.cpu\n")
    found = [_forbidden(m, "accelkit_bad") for _, m in _imports(bad)]
    assert all(found)
    assert len(found) == 2


def _slot_reads(path: Path) -> list[tuple[int, str]]:
    """``x._data`` and the like, on anything but ``self``."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, f"{ast.unparse(node.value)}.{node.attr}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in TENSOR_SLOTS
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]


@pytest.mark.parametrize("package", [*PLUGIN_SOURCES, EXAMPLE], ids=lambda p: p.name)
def test_a_plugin_reaches_tensors_through_the_sdk(package: Path) -> None:
    assert set(TENSOR_SLOTS) < set(__import__("accelkit").Tensor.__slots__)
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {expr}"
        for path in sorted(package.rglob("*.py"))
        for line, expr in _slot_reads(path)
    ]
    assert not problems, "\n".join(problems)


def test_the_slot_check_catches_a_private_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(x, self):\n    return x._data, self._data, x.shape\n")
    assert [expr for _, expr in _slot_reads(bad)] == ["x._data"]
