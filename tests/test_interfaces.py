"""A backend that forgets a required method fails when its class is instantiated, naming the
method, instead of computing garbage at run time: every abstract class of ``accelkit.sdk`` (and
of ``accelkit.abc``) enforces its abstract methods."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

import accelkit
import accelkit.abc
import accelkit.sdk
from accelkit import DType

INTERFACES = sorted(
    {
        cls
        for module in (accelkit.sdk, accelkit.abc)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if inspect.isabstract(cls)
    },
    key=lambda cls: cls.__name__,
)


def test_the_backend_interfaces_are_abstract() -> None:
    names = {cls.__name__ for cls in INTERFACES}
    expected = {
        "ComputeBackend", "StreamBackend", "QueuedBackend", "TensorKernels", "FactoryKernels", "FusedKernels",
        "KernelExecutor", "DeviceMemoryManager", "Event", "Stream",
    }  # fmt: skip
    assert expected <= names, expected - names


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.__name__)
def test_an_empty_subclass_cannot_be_instantiated(interface: type) -> None:
    empty = type(f"Empty{interface.__name__}", (interface,), {})
    missing = sorted(getattr(empty, "__abstractmethods__", ()))
    assert missing, f"{interface.__name__} declares no abstract method"
    with pytest.raises(TypeError, match=missing[0]):
        empty(None) if "backend" in inspect.signature(empty).parameters else empty()


def test_tensor_kernels_missing_one_kernel_fails_naming_it() -> None:
    """The defect seen in 1.x: a NormOps subclass with no hooks instantiated, and rms_norm
    returned uninitialised pool memory. Now the class cannot be instantiated at all."""
    from accelkit.backends.cpu.ops import CPUTensorKernels
    from accelkit.backends.cpu.submit import CPUComponent

    members = {k: v for k, v in vars(CPUTensorKernels).items() if k != "rms_norm"}
    forgetful = type("Forgetful", (CPUComponent, accelkit.sdk.TensorKernels), members)
    with pytest.raises(TypeError, match="rms_norm") as caught:
        forgetful(None)
    assert "unary" not in str(caught.value)  # only what is missing is named


@pytest.mark.anyio
async def test_the_user_components_are_built_over_the_kernel_objects() -> None:
    async with accelkit.open_backend("cpu") as backend:
        assert isinstance(backend.tensor_ops.kernels, accelkit.sdk.TensorKernels)
        assert isinstance(backend.tensor_factory.kernels, accelkit.sdk.FactoryKernels)
        assert isinstance(backend.kernel_ops.kernels, accelkit.sdk.FusedKernels)
        x = backend.tensor_factory.ones((3, 4), DType.F32)
        np.testing.assert_allclose(await backend.kernel_ops.rms_norm(x).to_host(), 1.0, 1e-5)


@pytest.mark.anyio
async def test_image_filters_run_the_backends_fused_depthwise_kernel(
    backend: accelkit.ComputeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regression of the kernel-object refactor: the CPU's fused depthwise filter had stayed a
    private method the core no longer called, and every image filter ran the slow composition."""
    kernels = backend.tensor_ops.kernels
    assert kernels.has_depthwise
    calls: list[tuple[int, ...]] = []
    fused = kernels.depthwise

    def counting(x: accelkit.Tensor, kernel: np.ndarray[Any, Any], out: accelkit.Tensor) -> None:
        calls.append(kernel.shape)
        fused(x, kernel, out)

    monkeypatch.setattr(kernels, "depthwise", counting)
    img = np.arange(2 * 3 * 9 * 11, dtype=np.float32).reshape(2, 3, 9, 11) / 600
    x = backend.tensor_factory.from_host(img)
    blurred = await backend.tensor_ops.gaussian_blur(x, sigma=1.0).to_host()
    assert calls == [(1, 7), (7, 1)]
    # The composition (pad + grouped conv2d) gives the same numbers.
    monkeypatch.setattr(type(kernels), "has_depthwise", property(lambda self: False))
    composed = await backend.tensor_ops.gaussian_blur(x, sigma=1.0).to_host()
    assert calls == [(1, 7), (7, 1)]
    np.testing.assert_allclose(blurred, composed, rtol=1e-5, atol=1e-6)
