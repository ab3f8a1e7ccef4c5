"""A griffe extension for the docs site (mkdocs.yml): the Sphinx roles in accelkit's docstrings
(``:class:`Tensor```, ``:func:`~accelkit.sdk.storage```, ``:mod:`accelkit.testing```) become
links to the API reference, where the name is documented, and plain code where it is not; a
paragraph's closing ``::`` before a literal block becomes ``:``.

mkdocstrings reads docstrings as Markdown and knows no roles: without this, every role shows as
``:class:`` before the name. A role's name is resolved in the scope of the object whose docstring
holds it (its imports, its members, its parents'), as Sphinx would; the link is an *optional*
cross-reference, so that a name the reference does not document (a private helper, a builtin)
renders as code without a warning, and ``mkdocs build --strict`` stays strict about the rest.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: A paragraph that ends in ``::`` before a literal block (reST): Markdown shows the block as code
#: already (it is indented), so one colon is kept.
LITERAL_MARKER = re.compile(r"::\n(?=[ \t]*\n)")
#: ``:role:`name```, ``:role:`~dotted.name```, ``:py:role:`...```: the roles the code uses.
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([\w.]+)(\(\))?`")


def qualify(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as written in ``obj``'s docstring: resolved from its first part
    in ``obj``'s scope, or left as written where it does not resolve (a full path already)."""
    head, _, rest = name.partition(".")
    try:
        resolved = obj.resolve(head)
    except griffe.NameResolutionError:
        return name
    return f"{resolved}.{rest}" if rest else resolved


def replace_roles(obj: griffe.Object, text: str) -> str:
    """``text`` with each role replaced by an optional cross-reference to its target."""

    def link(match: re.Match[str]) -> str:
        tilde, name, call = match.group(1), match.group(2), match.group(3) or ""
        title = (name.rpartition(".")[2] if tilde else name) + call
        identifier = html.escape(qualify(obj, name), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'

    return LITERAL_MARKER.sub(":\n", ROLE.sub(link, text))


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring in a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        pending: list[griffe.Object] = [pkg]
        while pending:
            obj = pending.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = replace_roles(obj, obj.docstring.value)
            pending.extend(m for m in obj.members.values() if not isinstance(m, griffe.Alias))
