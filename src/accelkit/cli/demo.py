"""``accelkit demo``: select the best backend on this machine (or the one asked for), say why,
then run the demo workload on it: a transformer block and an image pipeline, each checked
against NumPy and timed, with an event-loop heartbeat that shows the loop was never blocked."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import asdict

from accelkit.cli.render import print_json
from accelkit.cli.select import explain_table

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    import anyio

    from accelkit.demo import run_demo
    from accelkit.errors import InvalidArgumentError
    from accelkit.selector import select

    if args.repeats < 1:
        raise InvalidArgumentError(f"--repeats must be at least 1; got {args.repeats}")
    if args.loop == "trio" and importlib.util.find_spec("trio") is None:
        raise InvalidArgumentError("--loop trio needs the trio package: pip install trio")
    backend = args.backend.strip().lower() if args.backend else None
    selection = select(None, None, args.policy, backend=backend)

    def say(line: str) -> None:
        if not args.json:
            print(line, flush=True)

    say(f"selected: {selection.backend} on {selection.device}")
    say("")
    say(explain_table(selection.report))
    say("")
    result = anyio.run(
        lambda: run_demo(selection, repeats=args.repeats, say=say, isolate=args.isolate),
        backend=args.loop,
    )
    if args.json:
        print_json({"loop": args.loop, "selection": selection, **asdict(result)})
    return 0 if result.ok else 1
