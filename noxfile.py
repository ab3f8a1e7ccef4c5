"""Test sessions: ``nox`` runs tests, lint and typecheck; ``nox -s bench`` the benchmarks.

Sessions use the interpreter that runs nox (CI has exactly one), through uv when it is installed
(about four times faster than pip here) and pip otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys

import nox

os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
nox.options.default_venv_backend = "uv" if shutil.which("uv") else "virtualenv"
nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_venv = "yes"

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The core test suite, and the conformance suite on every installed backend: the CPU
    backend, the OpenCL backend on PoCL's CPU device, and the CUDA backend where a GPU is present
    (elsewhere its tests check the probe, the capabilities and NVRTC compilation, and the GPU
    tests skip with the reason)."""
    session.install(
        "-e",
        ".[test]",
        "-e",
        "./plugins/accelkit-opencl[pocl]",
        "-e",
        "./plugins/accelkit-cuda[cuda12]",
        # small plugin distributions made for the registry, selector and fallback tests
        "./tests/plugins/accelkit-testplug-good",
        "./tests/plugins/accelkit-testplug-broken",
        "./tests/plugins/accelkit-testplug-future",
        "./tests/plugins/accelkit-testplug-badprobe",
        "./tests/plugins/accelkit-testplug-subset",
    )
    session.run("pytest", "-p", "no:cacheprovider", *session.posargs)
    if not session.posargs:
        session.run("pytest", "-p", "no:cacheprovider", "plugins/accelkit-opencl/tests")
        session.run("pytest", "-p", "no:cacheprovider", "plugins/accelkit-cuda/tests")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "benchmarks", "plugins", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "benchmarks", "plugins", "noxfile.py")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the core and on the two device plugins (CuPy has no type information:
    its imports are Any)."""
    session.install("-e", ".", "-e", "./plugins/accelkit-opencl", "-e", "./plugins/accelkit-cuda")
    session.install("mypy>=1.10")
    session.run(
        "mypy", "--strict", "src/accelkit", "plugins/accelkit-opencl/src/accelkit_opencl",
        "plugins/accelkit-cuda/src/accelkit_cuda",
    )  # fmt: skip


@nox.session(python=PYTHON, venv_backend="virtualenv")
def bench(session: nox.Session) -> None:
    """Benchmarks, reported as ratios against NumPy and PyTorch (CPU) in the same process.

    pip rather than uv: pip finds the CPU build of PyTorch this machine keeps on disk, where uv
    would download a CUDA build of several GB.
    """
    session.install("-e", ".", "torch==2.13.0")
    session.run("python", "benchmarks/bench_startup.py")
    session.run("python", "benchmarks/bench_core.py", *session.posargs)
