"""A backend that forgets a required method fails when its class is instantiated, naming the
method, instead of computing garbage at run time (every abstract method is enforced)."""

from __future__ import annotations

import inspect

import pytest

from accelkit.abc import backend, factory, kernel_ops, kernels, memory, stream, tensor_ops

INTERFACES = [
    cls
    for module in (backend, factory, kernel_ops, kernels, memory, stream, tensor_ops)
    for _, cls in inspect.getmembers(module, inspect.isclass)
    if cls.__module__ == module.__name__ and inspect.isabstract(cls)
]


def test_the_component_interfaces_are_abstract() -> None:
    names = {cls.__name__ for cls in INTERFACES}
    expected = {
        "ComputeBackend", "TensorFactory", "TensorOps", "NormOps", "PositionOps",
        "AttentionOps", "ActivationOps", "LinearOps", "SamplingOps", "KernelExecutor",
        "DeviceMemoryManager", "Event", "Stream",
    }  # fmt: skip
    assert expected <= names, expected - names


@pytest.mark.parametrize("interface", INTERFACES, ids=lambda cls: cls.__name__)
def test_an_empty_subclass_cannot_be_instantiated(interface: type) -> None:
    empty = type(f"Empty{interface.__name__}", (interface,), {})
    missing = sorted(getattr(empty, "__abstractmethods__", ()))
    assert missing, f"{interface.__name__} declares no abstract method"
    with pytest.raises(TypeError, match=missing[0]):
        empty(None) if "backend" in inspect.signature(empty).parameters else empty()


def test_a_norm_ops_without_its_hooks_cannot_compute_garbage() -> None:
    """The defect seen: a NormOps subclass with no hooks instantiated, and rms_norm returned
    uninitialised pool memory."""

    class Forgetful(kernel_ops.NormOps):
        pass

    with pytest.raises(TypeError, match="_k_rms_norm"):
        Forgetful(None)  # type: ignore[abstract, arg-type]
