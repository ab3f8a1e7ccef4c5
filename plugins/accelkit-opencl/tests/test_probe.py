from __future__ import annotations

import os
import subprocess
import sys

import pytest
from accelkit_opencl import probe as probe_mod
from accelkit_opencl.probe import IMPLEMENTED_OPS, device_dtypes, probe

import accelkit as ak
from accelkit.dtype import DType
from accelkit.errors import DeviceError


def test_probe_lists_every_device_with_properties() -> None:
    infos = probe()
    assert infos, "conftest skips without a device"
    for i, info in enumerate(infos):
        assert info.device == f"opencl:{i}"
        assert info.backend == "opencl"
        assert info.name
        assert info.memory_bytes > 0
        assert info.compute_units > 0
        caps = info.capabilities
        assert caps is not None
        assert caps.limits.max_work_group_size > 0
        assert caps.ops == IMPLEMENTED_OPS
        ext = set(caps.extra["extensions"])
        assert (DType.F64 in caps.dtypes) == ("cl_khr_fp64" in ext) == caps.features.fp64
        assert (DType.F16 in caps.dtypes) == ("cl_khr_fp16" in ext) == caps.features.fp16
        assert DType.BF16 not in caps.dtypes


def test_dtypes_follow_extensions() -> None:
    assert DType.F64 not in device_dtypes("cl_khr_byte_addressable_store")
    assert DType.F16 not in device_dtypes("cl_khr_fp64")
    assert {DType.F16, DType.F64} <= device_dtypes("cl_khr_fp64 cl_khr_fp16")


def test_missing_pyopencl_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DeviceError, match="PyOpenCL is not installed"):
        probe()


def test_no_platform_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyopencl as cl

    monkeypatch.setattr(cl, "get_platforms", lambda: [])
    with pytest.raises(DeviceError, match="no OpenCL platform"):
        probe()


def test_registry_lists_the_plugin_without_importing_the_backend() -> None:
    code = (
        "import sys, accelkit as ak; d = [i.device for i in ak.devices()];"
        "assert 'opencl:0' in d, d;"
        "assert 'accelkit_opencl.backend' not in sys.modules;"
        "assert 'accelkit_opencl.tensor_kernels' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_descriptor_imports_no_pyopencl() -> None:
    code = (
        "import sys; import accelkit_opencl.descriptor as d; assert d.DESCRIPTOR.name == 'opencl';"
        "assert 'pyopencl' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_selector_ranks_opencl() -> None:
    sel = ak.select("opencl")
    assert sel.backend == "opencl"
    assert str(sel.device) == "opencl:0"


def test_a_program_that_ends_without_shutdown_exits_cleanly() -> None:
    """Work still queued when a program ends without ``shutdown()`` (or dies of an exception):
    the streams are closed at exit (the process aborted with status 134, "terminate called
    without an active exception", its threads in the driver while the interpreter finalized)."""
    code = (
        "import anyio, sys, numpy as np, accelkit as ak\n"
        "async def main():\n"
        "    b = ak.create_backend('opencl'); await b.initialize()\n"
        "    x = b.tensor_factory.from_host(np.ones((2048, 2048), np.float32))\n"
        "    for _ in range(int(sys.argv[1])): y = b.tensor_ops.matmul(x, x)\n"
        "    if sys.argv[2] == 'raise': raise RuntimeError('the app failed')\n"
        "anyio.run(main, backend=sys.argv[3])\n"
    )
    # Products of 2048 (seconds of PoCL's time): work still running at the exit, where the
    # abort happened (512 finished first here, with the kernel variants a fresh cache picks).
    env = {**os.environ, "ACCELKIT_OPENCL_VERIFY": "0"}
    for rounds, end, loop in (
        ("3", "return", "trio"), ("3", "return", "asyncio"), ("3", "raise", "trio"),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", code, rounds, end, loop],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == (1 if end == "raise" else 0), (rounds, end, done.stderr[-2000:])
        assert "terminate called" not in done.stderr
