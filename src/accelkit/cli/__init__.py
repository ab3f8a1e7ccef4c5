"""The ``accelkit`` command: argument parsing and error handling, shared by every subcommand.

Each subcommand lives in its own module (``accelkit.cli.<name>``) with one function,
``run(args) -> int``, imported only when that subcommand runs: ``accelkit --help`` and
``import accelkit.__main__`` load neither NumPy nor any backend.

Exit status: 0 success; 1 the command ran and found a problem (``doctor``'s findings, a demo
mismatch, a device that failed to calibrate); 2 bad input or a request nothing can serve (any
:class:`~accelkit.errors.AccelError`), printed as one line ``accelkit <cmd>: <message>``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

__all__ = ["main"]

COMMANDS: dict[str, str] = {
    "info": "version, plugins with their status, and devices",
    "devices": "list the devices every usable plugin reports",
    "select": "choose the best backend and device for a workload, and say why",
    "doctor": "diagnose plugins, settings and hardware, and self-test every backend",
    "calibrate": "measure each device and store the figures the selector ranks by",
    "bench": "time a few operations against NumPy in the same process",
    "demo": "select the best backend, run the demo workload on it, and time it",
}


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {value!r}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    from accelkit import __version__

    parser = argparse.ArgumentParser(
        prog="accelkit",
        description="accelkit: async-first tensor compute on whatever accelerator a machine has.",
        epilog="Run 'accelkit <command> --help' for a command's options. Every command accepts"
        " --json for machine-readable output.",
    )
    parser.add_argument("--version", action="version", version=f"accelkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    common.add_argument(
        "-v", "--verbose", action="store_true", help="more detail (tracebacks included)"
    )
    progress = argparse.ArgumentParser(add_help=False)
    progress.add_argument(
        "--progress",
        action="store_true",
        help="draw the progress bar on stderr even when it is not a terminal",
    )
    choosing = argparse.ArgumentParser(add_help=False)
    choosing.add_argument("--backend", metavar="B", help="use this backend (e.g. cpu, cuda)")
    choosing.add_argument(
        "--policy",
        default="performance",
        metavar="P",
        help="performance (default), memory, power or prefer:<kind>",
    )

    def add(name: str, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, parents=[common, *parents], help=COMMANDS[name], description=COMMANDS[name]
        )

    add("info", [])
    devices = add("devices", [])
    devices.add_argument("--backend", metavar="B", help="only the devices of this backend")

    select = add("select", [choosing])
    select.add_argument("--device", metavar="D", help="a device ('cuda:0') or a kind ('cuda')")
    select.add_argument(
        "--require",
        action="extend",
        type=_names,
        default=[],
        metavar="OPS",
        help="operations the workload needs, comma-separated (e.g. attention,matmul)",
    )
    select.add_argument(
        "--dtype",
        action="extend",
        type=_names,
        default=[],
        metavar="DTYPES",
        help="element types it needs, comma-separated (e.g. f16,f32)",
    )
    select.add_argument(
        "--feature",
        action="extend",
        type=_names,
        default=[],
        metavar="FEATURES",
        help="features it needs, comma-separated (e.g. fp16,async_copy)",
    )
    select.add_argument("--min-memory", metavar="SIZE", help="device memory needed, e.g. 8GiB")
    select.add_argument(
        "--explain", action="store_true", help="rank every candidate and give every rejection"
    )

    doctor = add("doctor", [progress])
    doctor.add_argument(
        "--no-selftest",
        action="store_true",
        help="skip the self-test of each backend (a few operations in a child process)",
    )
    doctor.add_argument(
        "--selftest-timeout",
        type=_seconds,
        default=120.0,
        metavar="S",
        help="give each step of a backend's self-test (start-up, each check) at most S seconds:"
        " one that takes longer is a hang (default 120)",
    )

    calibrate = add("calibrate", [progress])
    calibrate.add_argument("--backend", metavar="B", help="only the devices of this backend")
    calibrate.add_argument(
        "--quick", action="store_true", help="small sizes, few repeats (about a second)"
    )

    bench = add("bench", [choosing, progress])
    size = bench.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (a few seconds)")
    size.add_argument(
        "--full",
        action="store_true",
        help="the largest sizes and every round, with no time budget (slower)",
    )

    demo = add("demo", [choosing])
    demo.add_argument(
        "--repeats", type=int, default=3, metavar="N", help="transformer block runs (best counts)"
    )
    demo.add_argument(
        "--loop", choices=["asyncio", "trio"], default="asyncio", help="the event loop to run on"
    )
    demo.add_argument(
        "--isolate",
        action="store_true",
        help="run the backend in a supervised worker process (docs/isolation.md)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelkit`` command with ``argv`` (``sys.argv[1:]`` when None); returns the
    exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return exc.code if isinstance(exc.code, int) else 2
    command: str = args.command
    module = importlib.import_module(f"accelkit.cli.{command}")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning(command)
        try:
            status: int = module.run(args)
        except KeyboardInterrupt:
            print(f"accelkit {command}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `accelkit devices | head`: the reader left; not an error
            _silence_stdout()
            # A command whose status is a verdict (doctor) keeps it: `doctor | grep -q x` or
            # `| true` under pipefail reported a machine with problems as healthy.
            verdict: int = getattr(args, "verdict", 0)
            return verdict
        except BaseException as exc:
            errors = _accel_errors(exc)
            if errors is None:
                raise
            for err in errors:
                print(f"accelkit {command}: {err}", file=sys.stderr)
                if args.verbose:
                    traceback.print_exception(err, file=sys.stderr)
            return 2
    return status


def _accel_errors(exc: BaseException) -> list[BaseException] | None:
    """The AccelErrors (or OSErrors) ``exc`` stands for, looking through exception groups (a
    task group wraps what its tasks raise), or None when it is something else: a bug, which
    keeps its traceback."""
    from accelkit.errors import AccelError

    if isinstance(exc, (AccelError, OSError)):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in exc.exceptions:
            sub = _accel_errors(inner)
            if sub is None:
                return None
            found += sub
        return found
    return None


def _show_warning(command: str) -> Callable[..., None]:
    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"accelkit {command}: warning: {message}", file=file or sys.stderr)

    return show


def _silence_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
