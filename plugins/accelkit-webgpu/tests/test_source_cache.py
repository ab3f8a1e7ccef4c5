"""The WGSL source builders are cached: a launch builds no source its arguments built before
(they were rebuilt at every launch, 15-70 us of the caller's thread each, and the pipeline
cache then hashed a new string of several KiB; a 64x64 add's caller CPU time went from 57 to
17 us on a 2-core VM with the cache, ``benchmarks/bench_host.py --backend webgpu --cpu-time``).
No device needed: the builders are plain functions."""

from __future__ import annotations

from accelkit_webgpu import elementwise as ew
from accelkit_webgpu import kernels_reduce as kr

from accelkit.dtype import DType

F32, F16, I32 = DType.F32, DType.F16, DType.I32


def test_a_source_is_built_once_per_arguments() -> None:
    builders = [
        (ew.unary_source, ("exp", F32, F32, True)),
        (ew.binary_source, ("add", (F32, True), (F32, False), F32, F32, False)),
        (ew.where_source, (DType.BOOL, (F32, True), (F32, True), F32, True)),
        (ew.cast_source, (F32, F16)),
        (kr.reduce_source, ("sum", F32, F32, 1, 1, False)),
        (kr.softmax_source, (F32, F32, False, False, False)),
        (kr.norm_source, ("layer_norm", F32, F32, True, True, False)),
    ]
    for fn, args in builders:
        first = fn(*args)
        assert "fn main" in first or "@compute" in first, fn
        assert fn(*args) is first, fn  # the same object: built once, its hash computed once
    # Different arguments, a different source.
    assert ew.unary_source("exp", F32, F32, True) != ew.unary_source("exp", I32, F32, True)
    assert ew.cast_source(F32, F16) != ew.cast_source(F16, F32)
