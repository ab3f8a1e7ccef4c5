"""Choosing the packed GEMM's block per device: a default, and a measured winner stored on disk.

The block (rows x columns per work-item, vector width, K unroll, work-group shape) that runs
fastest depends on the device's vector registers and caches, so ``tune`` times a handful of
candidates on a 1024^3 product (a few seconds, with a progress line per candidate) and stores the
winner in ``gemm-tuning.json`` in the program cache folder (:func:`caches.cache_folder`), keyed
by platform, device name and driver version. Tuning runs only when asked for
(``python -m accelkit_opencl.gemm_tuning``), never on a user's first matmul; backends read the
stored winner when they first multiply, and ``ACCELKIT_OPENCL_GEMM_TUNING=0`` ignores it.

The file is data: JSON, validated on load; an unreadable or foreign one is ignored (the default
block runs) and the next tuning overwrites it atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelkit.dtype import DType
from accelkit.sdk import env_str
from accelkit_opencl.caches import cache_folder
from accelkit_opencl.opencl_linalg import GemmBlock

if TYPE_CHECKING:
    from accelkit_opencl.backend import OpenCLBackend

__all__ = [
    "CANDIDATES", "DEFAULT_BLOCKS", "block_for", "default_block", "device_key", "tune",
    "tuning_path",
]  # fmt: skip

#: The block each dtype runs without tuning on a device with 64-byte vectors (AVX-512): 8 x 2
#: vectors (16 of AVX-512's 32 registers hold the accumulators). Measured on PoCL, Xeon
#: (Ice Lake), f32 1024^3: 8x32 and 12x32 ~110-125 GFLOP/s, 4x64 ~90, 8x32 as arrays in loops ~30.
DEFAULT_BLOCKS: dict[DType, GemmBlock] = {
    DType.F32: GemmBlock(8, 32, 16, 4, (4, 4)),
    DType.F64: GemmBlock(8, 16, 8, 4, (4, 4)),
}

#: What ``tune`` tries per dtype besides the device's default.
CANDIDATES: dict[DType, tuple[GemmBlock, ...]] = {
    DType.F32: (
        GemmBlock(12, 32, 16, 2, (4, 4)),
        GemmBlock(8, 32, 16, 4, (8, 2)),
        GemmBlock(8, 16, 16, 4, (4, 4)),
        # 8-wide: the fastest here where the device's 16-wide report does not hold (PoCL's
        # LLVM 14 on Zen 4 compiles for znver3: 78 GFLOP/s against 6x16's 69 at 1024^3)
        GemmBlock(8, 16, 8, 4, (4, 4)),
        GemmBlock(6, 16, 8, 4, (4, 4)),
    ),
    DType.F64: (
        GemmBlock(12, 16, 8, 2, (4, 4)),
        GemmBlock(8, 8, 8, 4, (4, 4)),
        GemmBlock(6, 8, 4, 4, (4, 4)),
    ),
}


def default_block(cl_device: Any, dtype: DType) -> GemmBlock:
    """The untuned block: :data:`DEFAULT_BLOCKS` where the device's native vectors are 64
    bytes; with narrower ones (AVX2: 32 bytes, 16 registers) 6 rows x 2 native vectors, so the
    12 accumulators stay in registers."""
    block = DEFAULT_BLOCKS[dtype]
    native = int(getattr(cl_device, "native_vector_width_float", 16) or 1)
    if dtype is DType.F64:
        native = int(getattr(cl_device, "native_vector_width_double", 8) or 1) * 2
    if native >= 16:
        return block
    width = max(4, native) if dtype is DType.F32 else max(2, native // 2)
    return GemmBlock(6, 2 * width, width, 4, (4, 4))


def _candidates(cl_device: Any, dtype: DType) -> list[GemmBlock]:
    default = default_block(cl_device, dtype)
    return [default, *(b for b in CANDIDATES[dtype] if b != default)]


_FORMAT = "accelkit-opencl-gemm-tuning"
_stored: dict[str, dict[str, GemmBlock]] | None = None


def tuning_path() -> Path:
    return cache_folder() / "gemm-tuning.json"


def device_key(cl_device: Any) -> str:
    """The hardware and driver a tuning result holds for (as the program cache keys binaries)."""
    parts = (cl_device.platform.name, cl_device.name, cl_device.driver_version)
    return " | ".join(str(p).strip() for p in parts)


def _parse(data: Any) -> dict[str, dict[str, GemmBlock]]:
    if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("version") != 1:
        raise ValueError("not a gemm tuning file of version 1")
    devices: dict[str, dict[str, GemmBlock]] = {}
    for key, blocks in dict(data["devices"]).items():
        devices[str(key)] = {}
        for dtype, b in dict(blocks).items():
            block = GemmBlock(
                int(b["rows"]),
                int(b["cols"]),
                int(b["width"]),
                int(b["k_unroll"]),
                (int(b["local"][0]), int(b["local"][1])),
            )
            if not _valid(block):
                raise ValueError(f"invalid block {b!r}")
            devices[str(key)][DType(dtype).value] = block
    return devices


def _valid(b: GemmBlock) -> bool:
    return (
        b.width in (2, 4, 8, 16)
        and 1 <= b.rows <= 16
        and b.cols % b.width == 0
        and 1 <= b.cols // b.width <= 8
        and 1 <= b.k_unroll <= 8
        and all(1 <= x <= 64 for x in b.local)
    )


def _load() -> dict[str, dict[str, GemmBlock]]:
    global _stored
    if _stored is None:
        try:
            _stored = _parse(json.loads(tuning_path().read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
            _stored = {}
    return _stored


def _save(key: str, winners: dict[DType, GemmBlock]) -> Path:
    global _stored
    _stored = None
    devices = {k: {d: vars(b) for d, b in v.items()} for k, v in _load().items()}
    devices.setdefault(key, {}).update({d.value: vars(b) for d, b in winners.items()})
    path = tuning_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"format": _FORMAT, "version": 1, "devices": devices}, indent=2)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gemm-tuning-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _stored = None
    return path


def block_for(cl_device: Any, dtype: DType) -> GemmBlock:
    """The stored winner for this device and dtype, else the default."""
    if env_str("ACCELKIT_OPENCL_GEMM_TUNING") != "0":
        block = _load().get(device_key(cl_device), {}).get(dtype.value)
        if block is not None:
            return block
    return default_block(cl_device, dtype)


async def tune(
    backend: OpenCLBackend,
    dtypes: Sequence[DType] = (DType.F32,),
    *,
    size: int = 1024,
    rounds: int = 5,
    progress: Callable[[str], None] | None = None,
) -> dict[DType, GemmBlock]:
    """Time the blocks of the device's ``gemm_packed`` family that pass verification on an
    initialized backend (a ``size``-cubed matmul; median of ``rounds``, taken round-robin), drop
    any whose result differs from the first's, store the winners and return them.

    Every candidate is first verified in a child process (:mod:`accelkit_opencl.variants`, off
    the event loop; verdicts already stored are reused): a block that crashes the device's
    compiler is never built in this process. Each verified candidate then compiles once here
    (~0.2-1 s on PoCL) and runs ``rounds + 1`` times: about 5-10 s for f32 on a 2-core CPU, plus
    the verification the first time."""
    import functools

    import anyio

    say = progress or (lambda _msg: None)
    f, ops = backend.tensor_factory, backend.tensor_ops
    blocks: dict[DType, GemmBlock] = ops.__dict__.setdefault("_gemm_blocks", {})
    winners: dict[DType, GemmBlock] = {}
    verifier = backend._verifier
    try:
        for dt in dtypes:
            if dt not in CANDIDATES or dt not in backend.supported_dtypes:
                continue
            family = f"gemm_packed.{dt.value}"
            if verifier.enabled():
                run = functools.partial(verifier.run, say, [family], exhaustive=True)
                await anyio.to_thread.run_sync(run)
                cands = [c.value for c in verifier.passed(family)]
            else:  # verification is off: only the portable block is known to be safe
                from accelkit_opencl.variants import candidates

                cands = [candidates(backend._cl_device, family)[-1].value]
            if not cands:
                say(f"GEMM {dt.value}: no block passed verification; nothing to tune")
                continue
            a = f.uniform((size, size), -1.0, 1.0, seed=1, dtype=dt)
            b = f.uniform((size, size), -1.0, 1.0, seed=2, dtype=dt)
            reference = None
            times: dict[GemmBlock, list[float]] = {}
            for i, block in enumerate(cands):
                say(f"GEMM {dt.value} [{i + 1}/{len(cands)}] compiling {block.label()}")
                blocks[dt] = block
                got = await ops.matmul(a, b).to_host()
                if reference is None:
                    reference = got
                if float(abs(got - reference).max()) <= 1e-3 * float(abs(reference).max()):
                    times[block] = []
            # Round-robin, so that a neighbour's load on a shared machine hits every candidate
            # alike.
            for _ in range(rounds):
                for block in times:
                    blocks[dt] = block
                    t0 = time.perf_counter()
                    ops.matmul(a, b)
                    await backend.synchronize()
                    times[block].append(time.perf_counter() - t0)
            for block, ts in times.items():
                say(f"GEMM {dt.value} {block.label()}: {2 * size**3 / min(ts) / 1e9:.1f} GFLOP/s")
            winners[dt] = min(times, key=lambda blk: statistics.median(times[blk]))
    finally:
        blocks.clear()  # back to the device's verified choice (the stored winner, from now on)
    if winners:
        path = _save(device_key(backend._cl_device), winners)
        backend._variants.clear()
        say(f"stored in {path}")
    return winners


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m accelkit_opencl.gemm_tuning [--device N] [--f64]``."""
    import argparse

    import anyio

    import accelkit as ak

    parser = argparse.ArgumentParser(prog="python -m accelkit_opencl.gemm_tuning")
    parser.add_argument("--device", type=int, default=0, help="OpenCL device number")
    parser.add_argument("--f64", action="store_true", help="tune f64 as well as f32")
    args = parser.parse_args(argv)
    dtypes = (DType.F32, DType.F64) if args.f64 else (DType.F32,)

    async def run() -> None:
        async with ak.open_backend(f"opencl:{args.device}") as backend:
            winners = await tune(
                backend,  # type: ignore[arg-type]  # open_backend("opencl:N") opens an OpenCLBackend
                dtypes,
                progress=lambda msg: print(msg, file=sys.stderr, flush=True),
            )
            for dt, block in winners.items():
                print(f"{dt.value}: {block.label()}")

    anyio.run(run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
