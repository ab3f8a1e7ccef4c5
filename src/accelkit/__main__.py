"""The ``accelkit`` command (``python -m accelkit``); see :mod:`accelkit.cli`.

Importing this module imports nothing else: the subcommands load what they need when they run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelkit`` command; returns the exit status."""
    from accelkit.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
