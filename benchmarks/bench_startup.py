"""Start-up costs: ``import accelkit``, ``accelkit devices`` cold, and ``select()`` warm.

Run with ``python benchmarks/bench_startup.py`` (or ``nox -s bench``). Each figure is a median,
reported next to its peer measured the same way: ``import accelkit`` against ``import numpy``,
``accelkit devices`` against a bare ``python -c pass``, and ``select()`` against reading one
pydantic field. Targets (issue 3): import <= 150 ms and no backend module imported;
``accelkit devices`` cold <= 1.5 s with every installed plugin; warm ``select()`` <= 1 ms.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

_IMPORT = (
    "import time, sys; t = time.perf_counter(); import {mod}; "
    "print(time.perf_counter() - t); "
    "print(sorted(m for m in sys.modules if m.startswith('accelkit.backends.') and "
    "m.endswith('.backend') or m.startswith('accelkit_') and m.endswith('.backend')))"
)


def import_time(module: str, runs: int = 7) -> tuple[float, list[str]]:
    times, loaded = [], []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT.format(mod=module)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        times.append(float(out[0]))
        loaded = json.loads(out[1].replace("'", '"'))
    return statistics.median(times), loaded


def wall(argv: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    t_ak, loaded = import_time("accelkit")
    t_np, _ = import_time("numpy")
    print(
        f"[1/3] import accelkit: {1e3 * t_ak:.1f} ms (import numpy: {1e3 * t_np:.1f} ms);"
        f" backend modules imported: {loaded or 'none'} (target <= 150 ms, none)"
    )
    t_dev = wall([sys.executable, "-m", "accelkit", "devices"])
    t_py = wall([sys.executable, "-c", "pass"])
    print(
        f"[2/3] accelkit devices, cold process: {t_dev:.2f} s (bare python: {t_py:.2f} s)"
        " (target <= 1.5 s)"
    )
    import accelkit as ak

    ak.select()  # warm the registry's caches
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        ak.select()
    t_sel = (time.perf_counter() - t0) / n
    caps = ak.devices()[0].capabilities
    t0 = time.perf_counter()
    for _ in range(n):
        _ = caps.performance if caps else None
    t_field = (time.perf_counter() - t0) / n
    print(
        f"[3/3] select() warm: {1e6 * t_sel:.0f} us per call (a pydantic field read:"
        f" {1e9 * t_field:.0f} ns) (target <= 1000 us)"
    )


if __name__ == "__main__":
    main()
