"""tools/docs_roles.py, the griffe extension that turns the docstrings' Sphinx roles into the docs
site's cross-references (the docs part of the test session builds the real site with it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

griffe = pytest.importorskip("griffe", reason="the docs extra is not installed")

ROOT = Path(__file__).resolve().parents[1]
CODE = '''
"""The module. See :class:`Thing`, :func:`~os.path.join` and :meth:`Thing.go`::

        x = 1
    """

from os.path import join


class Thing:
    """See :meth:`go` and :data:`nowhere`."""

    def go(self) -> None: ...
'''


def _load_tool() -> Any:
    path = ROOT / "tools" / "docs_roles.py"
    spec = importlib.util.spec_from_file_location("accelkit_docs_roles", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ref(identifier: str, title: str) -> str:
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def test_roles_become_optional_references_resolved_in_scope() -> None:
    roles = _load_tool()
    with griffe.temporary_visited_module(CODE, module_name="m") as module:
        text = roles.replace_roles(module, module.docstring.value)
        assert f"See {ref('m.Thing', 'Thing')}, {ref('os.path.join', 'join')}" in text
        assert f"{ref('m.Thing.go', 'Thing.go')}:\n" in text  # the reST literal marker, one colon
        thing = module["Thing"]
        assert roles.replace_roles(thing, thing.docstring.value) == (
            f"See {ref('m.Thing.go', 'go')} and {ref('nowhere', 'nowhere')}."
        )
