"""The ``accelkit`` command (``python -m accelkit``)."""

from __future__ import annotations

import argparse
import sys

import anyio

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelkit", description="accelkit command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the demo workload, checked against NumPy and timed")
    demo.add_argument("--backend", default="cpu", help="backend to run on (default: cpu)")
    demo.add_argument("--repeats", type=int, default=3, help="transformer block runs (best counts)")
    demo.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio", help="event loop")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from accelkit.demo import run_demo
        from accelkit.errors import AccelError

        try:
            result = anyio.run(
                lambda: run_demo(args.backend, repeats=max(1, args.repeats)), backend=args.loop
            )
        except AccelError as exc:
            print(f"accelkit demo: {exc}", file=sys.stderr)
            return 2
        return 0 if result.ok else 1
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
