"""The OpenCL C source builders are cached: a launch builds no source its arguments built
before (they were rebuilt at every launch, 16 us an elementwise source on a 2-core VM; a 64x64
add's caller CPU time went from 75 to 45 us on PoCL with the cache,
``benchmarks/bench_host.py --backend opencl --cpu-time``). No device needed."""

from __future__ import annotations

from accelkit_opencl import opencl_elementwise as oe
from accelkit_opencl import opencl_reduction as orr

from accelkit.dtype import DType

F32, I32 = DType.F32, DType.I32


def test_a_source_is_built_once_per_arguments() -> None:
    two = (oe.Operand("a", F32, True), oe.Operand("b", F32, False))
    builders = [
        (oe.elementwise_source, (F32, F32, two, "a + b", 2)),
        (orr.reduce_source, ("sum", F32, F32, 1, 1, 64)),
        (orr.softmax_source, (F32, F32, False, 64)),
        (orr.norm_source, ("layer_norm", F32, True, True, 64)),
    ]
    for fn, args in builders:
        first = fn(*args)
        assert "__kernel" in first, fn
        assert fn(*args) is first, fn  # the same object: built once
    other = (oe.Operand("a", I32, True), oe.Operand("b", F32, False))
    assert oe.elementwise_source(F32, F32, other, "a + b", 2) != oe.elementwise_source(
        F32, F32, two, "a + b", 2
    )
