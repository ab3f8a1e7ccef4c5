"""Check that the built API reference documents every public name: each name in the ``__all__`` of
``accelkit`` and ``accelkit.sdk`` (or of the modules named on the command line) must be in the
site's inventory, ``site/objects.inv``, under its public path (``accelkit.Tensor``,
``accelkit.sdk.storage``). Run after ``mkdocs build`` (``nox -s docs`` runs both)::

    python tools/docs_check.py [--inventory site/objects.inv] [MODULE ...]

Exits 1 with the list of missing names. A name goes missing when it is added to ``__all__`` but
the reference cannot see it: accelkit's top level loads its names lazily (``_LAZY``), and griffe
reads them from the ``if TYPE_CHECKING:`` imports that mirror that table.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

#: The modules whose whole ``__all__`` the reference must document.
CHECKED = ("accelkit", "accelkit.sdk")
#: The first line of a Sphinx inventory of version 2 (mkdocstrings writes one).
HEADER = b"# Sphinx inventory version 2"


def inventory_names(data: bytes) -> set[str]:
    """The object names in a Sphinx inventory v2: four header lines, then zlib-compressed lines
    of ``name domain:role priority uri dispname``."""
    lines = data.split(b"\n", 4)
    if len(lines) < 5 or lines[0].rstrip() != HEADER:
        raise ValueError("not a Sphinx inventory of version 2")
    text = zlib.decompress(lines[4]).decode("utf-8")
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


def public_names(module: str) -> list[str]:
    """``module.name`` for each name in the module's ``__all__``."""
    names: Iterable[str] = getattr(importlib.import_module(module), "__all__", ())
    return [f"{module}.{name}" for name in names]


def missing(documented: set[str], modules: Sequence[str]) -> list[str]:
    """The public names of ``modules`` that the inventory does not hold, in ``__all__``'s order."""
    return [name for module in modules for name in public_names(module) if name not in documented]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=list(CHECKED), metavar="MODULE")
    parser.add_argument("--inventory", type=Path, default=Path("site/objects.inv"))
    args = parser.parse_args(argv)
    try:
        documented = inventory_names(args.inventory.read_bytes())
    except (OSError, ValueError, zlib.error) as exc:
        print(f"docs check: cannot read {args.inventory}: {exc} (run mkdocs build first)")
        return 1
    absent = missing(documented, args.modules)
    if absent:
        print(
            f"docs check: {len(absent)} public name(s) missing from the API reference"
            f" ({args.inventory}):"
        )
        for name in absent:
            print(f"  {name}")
        print(
            "Each needs a page (docs/reference/, in mkdocs.yml's nav) that documents its module,"
            " and griffe must see it (for accelkit's lazy names: the TYPE_CHECKING imports)."
        )
        return 1
    print(f"docs check: the API reference documents all public names of {', '.join(args.modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
