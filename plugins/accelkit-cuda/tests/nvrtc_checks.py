"""What the NVRTC kernel tests share: every kernel of a source compiles to a cubin for an
architecture, without warnings, spills, or more registers than a thread may have."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pytest


def nvrtc() -> Any:
    """The plugin's NVRTC module, or a skip saying why NVRTC is missing."""
    from accelkit_cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NVRTCUnavailable as exc:
        pytest.skip(f"NVRTC is not installed: {exc}")
    return nvrtc


def assert_compiles_without_spills(
    source: str, arch: str, names: Sequence[str], filename: str
) -> None:
    """Compile ``source`` for ``arch`` with ptxas's verbose report: each of ``names`` is in the
    cubin, no warning, no spill store or load, at most 255 registers a thread."""
    compiled = nvrtc().compile_cuda(source, arch, ("--ptxas-options=-v",), filename)
    assert compiled.kind == "cubin"
    for name in names:
        assert name.encode() + b"\0" in compiled.binary, name
    log = compiled.log
    assert "warning" not in log.lower(), log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == len(names), log
    assert all(s == ("0", "0") for s in spills), log  # the accumulators stay in registers
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    assert registers, log
    assert max(registers) <= 255, log
