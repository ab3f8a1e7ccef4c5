"""accelkit's pytest plugin (entry point ``pytest11``): the ``--accelkit-backend`` option of the
conformance suite (``pytest --pyargs accelkit.testing --accelkit-backend NAME``).

It adds only the option: the suite's fixtures live in ``accelkit/testing/conftest.py`` and so
apply to the suite alone, never to a project's own tests.
"""

from __future__ import annotations

import os
from typing import Any

#: The environment variable the option sets (read by :mod:`accelkit.testing.backends`).
BACKEND_ENV = "ACCELKIT_TEST_BACKEND"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("accelkit", "accelkit conformance suite")
    group.addoption(
        "--accelkit-backend",
        action="store",
        default=None,
        metavar="NAME[,NAME...]",
        help=(
            "the installed backend(s) the accelkit.testing conformance suite runs against"
            f" (default: ${BACKEND_ENV}, else every installed backend with a device)"
        ),
    )


def pytest_configure(config: Any) -> None:
    name = config.getoption("--accelkit-backend", default=None)
    if name:
        os.environ[BACKEND_ENV] = name
