"""Bad input: every refusal raises the right AccelError subclass, names what was expected and what
was given, and changes nothing (``memory_info().used`` is the same after the failed call).

Errors that only a kernel can see (an index out of range) surface when the result is awaited.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import numpy as np
import pytest

import accelkit
from accelkit import (
    AccelError,
    BackendNotFoundError,
    ComputeBackend,
    Device,
    DType,
    InvalidArgumentError,
    MemoryPoolConfig,
    NotInitializedError,
    OutOfMemoryError,
    StaleHandleError,
    UnsupportedOperationError,
)

from .checks import fetch

# A kernel check: one event loop per test function (accelkit.testing.plugin, one_loop).
pytestmark = [pytest.mark.anyio, pytest.mark.one_loop]


E = TypeVar("E", bound=AccelError)


def refuses(
    backend: ComputeBackend, exc_type: type[E], call: Callable[[], Any], *fragments: str
) -> E:
    """Run ``call``; it must raise ``exc_type`` with every fragment in its message and leave the
    memory statistics as they were (checked while the exception, and its frames, are alive)."""
    mm = backend.memory_manager
    before = mm.memory_info()
    with pytest.raises(exc_type) as info:
        call()
    after = mm.memory_info()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the message {message!r}"
    assert after.used == before.used, f"used went from {before.used} to {after.used}"
    assert after.active_allocations == before.active_allocations
    return info.value


def _tensors(backend: ComputeBackend) -> SimpleNamespace:
    f = backend.tensor_factory
    return SimpleNamespace(
        a23=f.ones((2, 3)),
        a34=f.ones((3, 4)),
        a45=f.ones((4, 5)),
        a234=f.ones((2, 3, 4)),
        a345=f.ones((3, 4, 5)),
        v3=f.ones((3,)),
        s=f.ones(()),
        i23=f.zeros((2, 3), DType.I32),
        i64=f.zeros((2,), DType.I64),
        i0=f.zeros((), DType.I64),
        u8=f.zeros((4,), DType.U8),
        b3=f.zeros((3,), DType.BOOL),
        f64_23=f.ones((2, 3), DType.F64),
        # Only where the device has f16 (the one case using it is skipped elsewhere).
        f16_q=f.ones((1, 2, 4, 8), DType.F16) if DType.F16 in backend.capabilities.dtypes else None,
        img=f.ones((1, 3, 5, 5)),
        w_conv=f.ones((2, 3, 3, 3)),
        q=f.ones((1, 4, 4, 8)),
        k=f.ones((1, 2, 4, 8)),
        k3=f.ones((1, 3, 4, 8)),
        k_d4=f.ones((1, 2, 4, 4)),
        emb=f.ones((7, 4)),
        a342=f.ones((3, 4, 2)),
        a43=f.ones((4, 3)),
        a24=f.ones((2, 4)),
        a13=f.ones((1, 3)),
        a23b=f.ones((2, 3)),
        a23c=f.ones((2, 3)),
        a23d=f.ones((2, 3)),
        e03=f.ones((0, 3)),
        v2=f.ones((2,)),
        b4=f.zeros((4,), DType.BOOL),
        i14=f.zeros((1, 4), DType.I64),
        i44=f.zeros((4, 4), DType.I32),
        i64_3=f.zeros((3,), DType.I64),
        w_conv2=f.ones((2, 2, 3, 3)),
        w_conv64=f.ones((2, 3, 3, 3), DType.F64),
        img3=f.ones((3, 5, 5)),
        img_small=f.ones((1, 3, 2, 2)),
        img_i32=f.ones((1, 3, 5, 5), DType.I32),
        img2=f.zeros((1, 2, 4, 4), DType.U8),
        q3d=f.ones((4, 4, 8)),
        k_s3=f.ones((1, 2, 3, 8)),
        m55=f.ones((5, 5)),
    )


IAE, UOE = InvalidArgumentError, UnsupportedOperationError

# name -> (error, call(ops, factory, tensors), message fragments). Inputs come from the prepared
# tensors, so that the call itself allocates only what the operation under test allocates.
SUBMISSION_CASES: dict[str, tuple[type[AccelError], Callable[..., Any], tuple[str, ...]]] = {
    # shapes
    "add_shapes": (IAE, lambda o, f, t: o.add(t.a23, t.a34), ("(2, 3)", "(3, 4)")),
    "where_shapes": (IAE, lambda o, f, t: o.where(t.b3, t.a34, 0.0), ("(3,)", "(3, 4)")),
    "matmul_inner": (IAE, lambda o, f, t: o.matmul(t.a23, t.a45), ("(2, 3)", "(4, 5)")),
    "matmul_0d": (IAE, lambda o, f, t: o.matmul(t.s, t.a23), ("()", "(2, 3)")),
    "matmul_batch": (IAE, lambda o, f, t: o.matmul(t.a234, t.a342), ("(2,)", "(3,)")),
    "gemm_rank": (IAE, lambda o, f, t: o.gemm(t.a234, t.a34), ("2-d", "(2, 3, 4)")),
    "gemm_inner": (IAE, lambda o, f, t: o.gemm(t.a23, t.a45), ("(2, 3)", "(4, 5)")),
    "gemm_trans_inner": (
        IAE,
        lambda o, f, t: o.gemm(t.a23, t.a34, trans_a=True),
        ("trans_a=True", "(2, 3)"),
    ),
    "gemm_c_shape": (IAE, lambda o, f, t: o.gemm(t.a23, t.a34, t.v3, beta=1.0), ("(3,)", "(2, 4)")),
    "batched_gemm_batch": (
        IAE,
        lambda o, f, t: o.batched_gemm(t.a234, t.a345),
        ("batch 2", "batch 3"),
    ),
    "linear_features": (IAE, lambda o, f, t: o.linear(t.a23, t.a45), ("(2, 3)", "(4, 5)")),
    "linear_bias": (IAE, lambda o, f, t: o.linear(t.a23, t.a43, t.v3), ("[4]", "(3,)")),
    "conv_channels": (
        IAE,
        lambda o, f, t: o.conv2d(t.img, t.w_conv2),
        ("(2, 2, 3, 3)", "3 are expected"),
    ),
    "conv_rank": (IAE, lambda o, f, t: o.conv2d(t.img3, t.w_conv), ("(3, 5, 5)", "(2, 3, 3, 3)")),
    "conv_too_small": (IAE, lambda o, f, t: o.conv2d(t.img_small, t.w_conv), ("3x3", "2x2")),
    "conv_groups": (IAE, lambda o, f, t: o.conv2d(t.img, t.w_conv, groups=2), ("groups=2", "(3)")),
    "conv_bias": (IAE, lambda o, f, t: o.conv2d(t.img, t.w_conv, t.v3), ("[2]", "(3,)")),
    "conv_stride": (IAE, lambda o, f, t: o.conv2d(t.img, t.w_conv, stride=0), ("stride", "0")),
    "conv_padding": (
        IAE,
        lambda o, f, t: o.conv2d(t.img, t.w_conv, padding=(1, 2, 3)),
        ("padding", "(1, 2, 3)"),
    ),
    "attn_heads": (IAE, lambda o, f, t: o.attention(t.q, t.k3, t.k3), ("4 heads", "3 heads")),
    "attn_head_dim": (IAE, lambda o, f, t: o.attention(t.q, t.k_d4, t.k_d4), ("8", "4")),
    "attn_kv": (
        IAE,
        lambda o, f, t: o.attention(t.q, t.k, t.k_s3),
        ("(1, 2, 4, 8)", "(1, 2, 3, 8)"),
    ),
    "attn_rank": (IAE, lambda o, f, t: o.attention(t.q3d, t.k, t.k), ("q", "(4, 4, 8)")),
    "attn_mask_shape": (
        IAE,
        lambda o, f, t: o.attention(t.q, t.k, t.k, mask=t.m55),
        ("(5, 5)", "(1, 4, 4, 4)"),
    ),
    "attn_mask_dtype": (
        IAE,
        lambda o, f, t: o.attention(t.q, t.k, t.k, mask=t.i44),
        ("mask", "i32"),
    ),
    "reshape_size": (IAE, lambda o, f, t: o.reshape(t.a23, (4, 2)), ("(2, 3)", "(4, 2)")),
    "reshape_two_unknowns": (IAE, lambda o, f, t: o.reshape(t.a234, (-1, -1)), ("-1", "(-1, -1)")),
    "reshape_infer": (IAE, lambda o, f, t: o.reshape(t.a23, (4, -1)), ("(4, -1)", "6")),
    "permute_not_perm": (
        IAE,
        lambda o, f, t: o.permute(t.a234, (0, 0, 1)),
        ("(0, 0, 1)", "permutation"),
    ),
    "permute_len": (IAE, lambda o, f, t: o.permute(t.a234, (0, 1)), ("3 axes", "(2, 3, 4)")),
    # Tuples of ints take a shorter check (the common case): what it must not let through.
    "permute_bool_axes": (
        IAE,
        lambda o, f, t: o.permute(t.a234, (False, True, 2)),
        ("dims", "bool"),
    ),
    "reshape_bool_dim": (IAE, lambda o, f, t: o.reshape(t.a23, (True, 6)), ("shape[0]", "bool")),
    "reshape_negative": (IAE, lambda o, f, t: o.reshape(t.a23, (-2, -3)), ("shape[0]", ">= -1")),
    "transpose_1d": (IAE, lambda o, f, t: o.transpose(t.v3), ("2 dimensions", "(3,)")),
    "concat_shapes": (IAE, lambda o, f, t: o.concat([t.a23, t.a24], axis=0), ("(2, 4)", "(2, 3)")),
    "concat_empty": (IAE, lambda o, f, t: o.concat([]), ("at least one",)),
    "stack_shapes": (IAE, lambda o, f, t: o.stack([t.a23, t.a34]), ("(3, 4)", "(2, 3)")),
    "narrow_range": (IAE, lambda o, f, t: o.narrow(t.a23, 1, 2, 5), ("[2, 7)", "size 3")),
    "split_uneven": (IAE, lambda o, f, t: o.split(t.a23, 2, axis=1), ("size 3", "2 equal")),
    "split_sizes": (IAE, lambda o, f, t: o.split(t.a23, [1, 1], axis=1), ("[1, 1]", "3")),
    "gather_rank": (IAE, lambda o, f, t: o.gather(t.a23, 0, t.i64), ("(2,)", "(2, 3)")),
    "gather_too_wide": (IAE, lambda o, f, t: o.gather(t.a23, 0, t.i14), ("(1, 4)", "(2, 3)")),
    "scatter_src": (IAE, lambda o, f, t: o.scatter(t.a23, 0, t.i23, t.a13), ("(1, 3)", "(2, 3)")),
    # Found by a review: keepdims="yes" was True on OpenCL and WebGPU, a DeviceError at the
    # await on the CPU (after allocating).
    "keepdims_str": (IAE, lambda o, f, t: o.sum(t.a23, 0, keepdims="yes"), ("keepdims", "'yes'")),
    "keepdims_none": (IAE, lambda o, f, t: o.max(t.a23, 1, keepdims=None), ("keepdims", "None")),
    # Found by a review: ops that index an axis's length raised a bare IndexError for a 0-d
    # tensor (and the CPU's gather accepted it).
    "concat_0d": (IAE, lambda o, f, t: o.concat([t.s, t.s], 0), ("concat", "0-d")),
    "split_0d": (IAE, lambda o, f, t: o.split(t.s, 1, 0), ("split", "0-d")),
    "narrow_0d": (IAE, lambda o, f, t: o.narrow(t.s, 0, 0, 1), ("narrow", "0-d")),
    "flip_0d": (IAE, lambda o, f, t: o.flip(t.s, 0), ("flip", "0-d")),
    "gather_0d": (IAE, lambda o, f, t: o.gather(t.s, 0, t.i0), ("gather", "0-d")),
    # Found by a review: OpenCL read an I32 src's bits as F32 (the CPU converted the values).
    "scatter_src_dtype": (
        IAE,
        lambda o, f, t: o.scatter(t.a23, 0, t.i23, t.i23),
        ("src is i32", "x is f32"),
    ),
    "axis_range": (IAE, lambda o, f, t: o.sum(t.a23, axis=2), ("axis 2", "2-d")),
    "axis_repeat": (IAE, lambda o, f, t: o.sum(t.a23, axis=(0, 0)), ("(0, 0)",)),
    "argmax_axes": (IAE, lambda o, f, t: o.argmax(t.a23, axis=(0, 1)), ("argmax", "(0, 1)")),
    "max_empty": (IAE, lambda o, f, t: o.max(t.e03, axis=0), ("(0, 3)",)),
    "softmax_axis": (IAE, lambda o, f, t: o.softmax(t.a23, axis=5), ("axis 5", "2-d")),
    "layer_norm_weight": (IAE, lambda o, f, t: o.layer_norm(t.a34, t.v3), ("[4]", "(3,)")),
    "rms_norm_weight": (IAE, lambda o, f, t: o.rms_norm(t.a34, t.v3), ("[4]", "(3,)")),
    "layer_norm_eps": (IAE, lambda o, f, t: o.layer_norm(t.a34, eps=0.0), ("eps", "0.0")),
    "ce_shapes": (IAE, lambda o, f, t: o.cross_entropy(t.a23, t.i64_3), ("(2, 3)", "(3,)")),
    "ce_reduction": (
        IAE,
        lambda o, f, t: o.cross_entropy(t.a23, t.i64, reduction="avg"),
        ("'avg'", "'mean'"),
    ),
    "embedding_weight": (IAE, lambda o, f, t: o.embedding(t.i64, t.a234), ("[V, D]", "(2, 3, 4)")),
    "adam_shape": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.a34, t.a23, t.a23, lr=0.1, step=1),
        ("(3, 4)", "(2, 3)"),
    ),
    "adam_aliasing": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.a23b, t.a23, t.a23c, lr=0.1, step=1),
        ("distinct",),
    ),
    "adam_beta": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.a23b, t.a23c, t.a23d, lr=0.1, step=1, beta1=1.0),
        ("beta1", "[0, 1)", "1.0"),
    ),
    "adam_lr": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.a23b, t.a23c, t.a23d, lr=-0.1, step=1),
        ("lr must be >= 0", "-0.1"),
    ),
    "adam_weight_decay": (
        IAE,
        lambda o, f, t: o.adam_update(
            t.a23, t.a23b, t.a23c, t.a23d, lr=0.1, step=1, weight_decay=-1.0
        ),
        ("weight_decay must be >= 0", "-1.0"),
    ),
    "adam_step": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.a23b, t.a23c, t.a23d, lr=0.1, step=0),
        ("step", ">= 1", "0"),
    ),
    "image_rank": (IAE, lambda o, f, t: o.gaussian_blur(t.a23), ("[N, C, H, W]", "(2, 3)")),
    "grayscale_channels": (IAE, lambda o, f, t: o.grayscale(t.img2), ("3 (RGB)", "got 2")),
    "blur_even_kernel": (IAE, lambda o, f, t: o.gaussian_blur(t.img, 1.0, 4), ("odd", "4")),
    "blur_sigma": (IAE, lambda o, f, t: o.gaussian_blur(t.img, 0.0), ("sigma", "0.0")),
    "brightness_negative": (IAE, lambda o, f, t: o.brightness(t.img, -1.0), (">= 0", "-1.0")),
    # dtypes
    "conv_dtypes": (IAE, lambda o, f, t: o.conv2d(t.img, t.w_conv64), ("f64", "f32")),
    "conv_int": (IAE, lambda o, f, t: o.conv2d(t.img_i32, t.w_conv), ("floating", "i32")),
    "attn_dtypes": (IAE, lambda o, f, t: o.attention(t.f16_q, t.k, t.k), ("f32", "f16")),
    "concat_dtypes": (IAE, lambda o, f, t: o.concat([t.a23, t.i23]), ("i32", "f32")),
    "layer_norm_int": (IAE, lambda o, f, t: o.layer_norm(t.i23), ("floating", "i32")),
    "layer_norm_weight_dtype": (IAE, lambda o, f, t: o.layer_norm(t.f64_23, t.v3), ("f32", "f64")),
    "gather_float_index": (IAE, lambda o, f, t: o.gather(t.a23, 0, t.a23), ("integer", "f32")),
    "embedding_float_index": (IAE, lambda o, f, t: o.embedding(t.v3, t.emb), ("integer", "f32")),
    "ce_float_targets": (IAE, lambda o, f, t: o.cross_entropy(t.a23, t.v2), ("integer", "f32")),
    "where_cond": (IAE, lambda o, f, t: o.where(t.v3, t.v3, 0.0), ("bool", "f32")),
    "where_scalars": (IAE, lambda o, f, t: o.where(t.b3, 1.0, 0.0), ("two scalars",)),
    "adam_dtypes": (
        IAE,
        lambda o, f, t: o.adam_update(t.a23, t.f64_23, t.a23c, t.a23d, lr=0.1, step=1),
        ("f64", "f32"),
    ),
    "matmul_bool": (IAE, lambda o, f, t: o.matmul(t.b3, t.b3), ("bool",)),
    "neg_bool": (IAE, lambda o, f, t: o.neg(t.b3), ("neg", "bool")),
    "sub_bool": (IAE, lambda o, f, t: o.sub(t.b3, t.b3), ("sub", "bool")),
    "u8_scalar_overflow": (IAE, lambda o, f, t: o.add(t.u8, 300), ("300", "u8")),
    "i32_scalar_overflow": (IAE, lambda o, f, t: o.mul(t.i23, 2**40), (str(2**40), "i32")),
    "where_scalar_overflow": (IAE, lambda o, f, t: o.where(t.b4, 300, t.u8), ("300", "u8")),
    "scatter_scalar_overflow": (IAE, lambda o, f, t: o.scatter(t.u8, 0, t.i64, 256), ("256", "u8")),
    "scatter_float_into_int": (
        IAE,
        lambda o, f, t: o.scatter(t.u8, 0, t.i64, 1.5),
        ("float", "u8"),
    ),
    "unknown_dtype": (IAE, lambda o, f, t: f.zeros((2,), "fp8"), ("'fp8'", "f32")),
    "cast_unknown_dtype": (IAE, lambda o, f, t: o.cast(t.v3, "complex64"), ("complex64",)),
    "uniform_int": (IAE, lambda o, f, t: f.uniform((2,), dtype=DType.I32), ("floating", "i32")),
    "full_fraction_into_int": (IAE, lambda o, f, t: f.full((4,), 1.5, DType.I32), ("1.5", "i32")),
    "full_nan_into_int": (
        IAE,
        lambda o, f, t: f.full((4,), float("nan"), DType.I64),
        ("nan", "i64"),
    ),
    "full_out_of_range": (IAE, lambda o, f, t: f.full((4,), 256, DType.U8), ("256", "u8")),
    "full_not_a_number": (IAE, lambda o, f, t: f.full((4,), "1"), ("number", "str")),
    # wrong Python types
    "op_on_ndarray": (IAE, lambda o, f, t: o.relu(np.ones(3)), ("Tensor", "ndarray")),
    "two_scalars": (IAE, lambda o, f, t: o.add(1, 2), ("at least one Tensor", "int")),
    "scalar_type": (IAE, lambda o, f, t: o.add(t.v3, "1"), ("str",)),
    "unknown_unary": (IAE, lambda o, f, t: o.unary("cube", t.v3), ("'cube'", "relu")),
    "unknown_binary": (IAE, lambda o, f, t: o.binary("atan2", t.v3, t.v3), ("'atan2'", "add")),
    "unknown_reduce": (IAE, lambda o, f, t: o.reduce("median", t.v3), ("'median'", "sum")),
    "gelu_mode": (IAE, lambda o, f, t: o.gelu(t.v3, approximate="fast"), ("'fast'", "'tanh'")),
    "gemm_alpha_nan": (
        IAE,
        lambda o, f, t: o.gemm(t.a23, t.a34, alpha=float("nan")),
        ("alpha", "NaN"),
    ),
    "attn_scale_type": (
        IAE,
        lambda o, f, t: o.attention(t.q, t.k, t.k, scale="big"),
        ("scale", "str"),
    ),
    "attn_scale_inf": (
        IAE,
        lambda o, f, t: o.attention(t.q, t.k, t.k, scale=float("inf")),
        ("scale", "finite"),
    ),
    "from_host_tensor": (IAE, lambda o, f, t: f.from_host(t.v3), ("to_device",)),
    "from_host_ragged": (IAE, lambda o, f, t: f.from_host([[1, 2], [3]]), ("list",)),
    # sizes
    "negative_dim": (IAE, lambda o, f, t: f.empty((2, -1)), ("non-negative", "(2, -1)")),
    "absurd_size": (
        IAE,
        lambda o, f, t: f.zeros((1 << 30, 1 << 30)),
        ("more than any device", str(1 << 60)),
    ),
    "shape_type": (IAE, lambda o, f, t: f.empty((2, "x")), ("shape[1]", "str")),
    "shape_float": (IAE, lambda o, f, t: f.empty(2.5), ("shape", "float")),
    "arange_step": (IAE, lambda o, f, t: f.arange(0, 5, 0), ("step", "0")),
    "eye_negative": (IAE, lambda o, f, t: f.eye(-1), ("n", ">= 0", "-1")),
    "uniform_bounds": (IAE, lambda o, f, t: f.uniform((2,), 2.0, 1.0), ("high (1.0)", "low (2.0)")),
    "normal_std": (IAE, lambda o, f, t: f.normal((2,), 0.0, -1.0), ("std", "-1.0")),
    # Regressions (issue 15): raw Python/NumPy exceptions, and seeds checked only when the
    # generator ran (after the output was allocated).
    "arange_inf": (IAE, lambda o, f, t: f.arange(0, float("inf")), ("stop", "finite")),
    "arange_too_long": (IAE, lambda o, f, t: f.arange(0, 1e300, 1e-300), ("more than any",)),
    "arange_huge_int": (IAE, lambda o, f, t: f.arange(0, 10**400), ("stop", "too large")),
    "reshape_none": (IAE, lambda o, f, t: o.reshape(t.a23, None), ("shape", "NoneType")),
    "reshape_str": (IAE, lambda o, f, t: o.reshape(t.a23, "6"), ("shape", "str")),
    "empty_huge_zero_size": (
        IAE,
        lambda o, f, t: f.empty((2**31, 2**31, 0)),
        ("(2147483648, 2147483648, 0)", "more than any device"),
    ),
    "seed_negative": (IAE, lambda o, f, t: f.normal((3,), seed=-1), ("seed", "-1")),
    "seed_str": (IAE, lambda o, f, t: f.normal((3,), seed="x"), ("seed", "str")),
    "seed_float": (IAE, lambda o, f, t: f.uniform((3,), seed=1.5), ("seed", "float")),
    "seed_bool": (IAE, lambda o, f, t: f.uniform((3,), seed=True), ("seed", "bool")),
    "uniform_inf": (IAE, lambda o, f, t: f.uniform((3,), 0.0, float("inf")), ("high", "finite")),
    "normal_inf": (IAE, lambda o, f, t: f.normal((3,), float("-inf")), ("mean", "finite")),
    # Found by a review: a range beyond float64 failed at the await, not at the call; an
    # object without __dlpack__ raised a bare AttributeError.
    "uniform_range": (IAE, lambda o, f, t: f.uniform((3,), -1.7e308, 1.7e308), ("high - low",)),
    "from_dlpack_list": (IAE, lambda o, f, t: f.from_dlpack([1, 2]), ("from_dlpack", "list")),
    # Found by the fuzzing suite (test_fuzz.py): unhashable op names, sections=None, a sigma
    # whose kernel would not fit in memory.
    "unary_op_list": (IAE, lambda o, f, t: o.unary([], t.v3), ("unknown unary op", "[]")),
    "binary_op_list": (IAE, lambda o, f, t: o.binary([], t.v3, t.v3), ("unknown binary op",)),
    "reduce_op_list": (IAE, lambda o, f, t: o.reduce([], t.v3), ("unknown reduction",)),
    "split_none": (IAE, lambda o, f, t: o.split(t.a23, None, 1), ("sections", "NoneType")),
    "blur_huge_sigma": (IAE, lambda o, f, t: o.gaussian_blur(t.img, 1e17), ("sigma", "taps")),
    "blur_inf_sigma": (
        IAE,
        lambda o, f, t: o.gaussian_blur(t.img, float("inf")),
        ("sigma", "finite"),
    ),
}


@pytest.mark.parametrize("case", list(SUBMISSION_CASES))
async def test_submission_refuses_bad_input(backend: ComputeBackend, case: str) -> None:
    exc_type, call, fragments = SUBMISSION_CASES[case]
    t = _tensors(backend)
    if case == "attn_dtypes" and t.f16_q is None:
        pytest.skip(f"{backend.name} does not claim dtype f16")
    ops, f = backend.tensor_ops, backend.tensor_factory
    refuses(backend, exc_type, lambda: call(ops, f, t), *fragments)
    # The backend is still usable afterwards.
    np.testing.assert_array_equal(await fetch(ops.add(t.v3, 1.0)), [2.0, 2.0, 2.0])


async def test_invalid_argument_error_is_a_value_error(backend: ComputeBackend) -> None:
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        backend.tensor_ops.add(
            backend.tensor_factory.ones((2, 3)), backend.tensor_factory.ones((4,))
        )


# -- sizes and memory limits ------------------------------------------------------------------------
async def test_allocation_larger_than_the_device(backend: ComputeBackend) -> None:
    err = refuses(
        backend, OutOfMemoryError, lambda: backend.tensor_factory.empty((1 << 20, 1 << 20))
    )
    assert err.requested == 4 << 40
    assert isinstance(err, MemoryError)
    err = refuses(backend, OutOfMemoryError, lambda: backend.memory_manager.allocate(1 << 50))
    assert err.requested == 1 << 50


@pytest.mark.parametrize(
    ("nbytes", "fragments"),
    [(-5, ("nbytes", ">= 0", "-5")), (1.5, ("nbytes", "float")), ("10", ("nbytes", "str"))],
)
async def test_allocate_refuses_bad_sizes(
    backend: ComputeBackend,
    nbytes: Any,  # deliberately not always an int: the error under test
    fragments: tuple[str, ...],
) -> None:
    refuses(
        backend, InvalidArgumentError, lambda: backend.memory_manager.allocate(nbytes), *fragments
    )


async def test_memory_limit_raises_out_of_memory_naming_requested_and_used(
    backend: ComputeBackend,
) -> None:
    mm, f = backend.memory_manager, backend.tensor_factory
    mm.configure_pool(MemoryPoolConfig(limit_bytes=1 << 20))
    try:
        assert mm.memory_info().total == 1 << 20
        keep = f.zeros((100_000,), DType.U8)  # within the limit
        used = mm.memory_info().used
        assert used >= 100_000
        err = refuses(
            backend, OutOfMemoryError, lambda: f.zeros((1 << 19,), DType.F32), "2.0 MiB", "in use"
        )
        assert err.requested == 2 << 20
        assert err.used == used
        assert err.limit == 1 << 20
        # Just over what is left: refused too, and the message names the bytes in use.
        left = (1 << 20) - used
        err = refuses(backend, OutOfMemoryError, lambda: mm.allocate(left + 1), "in use")
        assert err.requested == left + 1
        assert err.used == used
        # Exactly what is left still fits.
        buf = mm.allocate(left)
        assert mm.memory_info().used == 1 << 20
        mm.free(buf)
        np.testing.assert_array_equal(await fetch(keep), np.zeros(100_000, np.uint8))
    finally:
        mm.configure_pool(MemoryPoolConfig())
    assert mm.memory_info().total > 1 << 20


async def test_a_limit_counts_no_dropped_tensor_that_queued_work_still_holds(
    backend: ComputeBackend,
) -> None:
    """Under a 1 MiB limit, a loop that keeps one 320 kB tensor alive (three while it rebinds)
    never runs out: an allocation over the limit first waits for the queued work that still
    holds the dropped tensors' buffers (OpenCL, WebGPU and the example plugin raised
    OutOfMemoryError on the second round, "781.2 KiB in use" with no tensor held), and memory
    the program holds is still refused."""
    mm, f, ops = backend.memory_manager, backend.tensor_factory, backend.tensor_ops
    await backend.synchronize()
    mm.configure_pool(MemoryPoolConfig(limit_bytes=1 << 20))
    try:
        t = f.zeros((80_000,))
        for _ in range(20):
            t = ops.add(ops.add(f.zeros((80_000,)), t), 1.0)
        np.testing.assert_array_equal(await fetch(t), np.full(80_000, 20.0, np.float32))
        refuses(backend, OutOfMemoryError, lambda: f.zeros((200_000,)), "in use")
    finally:
        mm.configure_pool(MemoryPoolConfig())


# -- other backends, freed tensors, lifecycle -------------------------------------------------------
async def test_tensors_of_another_backend_instance_are_refused(backend: ComputeBackend) -> None:
    async with accelkit.open_backend(backend.name) as other:
        foreign = other.tensor_factory.ones((3,))
        mine = backend.tensor_factory.ones((3,))
        ops = backend.tensor_ops
        for call in (
            lambda: ops.add(mine, foreign),
            lambda: ops.add(foreign, mine),
            lambda: ops.relu(foreign),
            lambda: ops.concat([mine, foreign]),
            lambda: ops.attention(*(other.tensor_factory.ones((1, 1, 2, 2)),) * 3),
        ):
            refuses(backend, InvalidArgumentError, call, "to_device")
        refuses(backend, InvalidArgumentError, lambda: backend.memory_manager.free(foreign))
        foreign_buffer = other.memory_manager.allocate(16)
        refuses(backend, StaleHandleError, lambda: backend.memory_manager.free(foreign_buffer))
        with pytest.raises(InvalidArgumentError), backend.use_stream(other.create_stream()):
            pass
        # The foreign tensor still works on its own backend.
        np.testing.assert_array_equal(
            await fetch(other.tensor_ops.add(foreign, 1.0)), [2.0, 2.0, 2.0]
        )


async def test_freed_tensors_raise_stale_handle(backend: ComputeBackend) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    t = f.ones((4,))
    view = ops.reshape(t, (2, 2))
    live22, live4 = f.ones((2, 2)), f.ones((4,))
    used = mm.memory_info().used
    mm.free(t)
    assert mm.memory_info().used == used - 16
    assert not t.is_alive
    assert not view.is_alive
    assert "freed" in repr(t)
    refuses(backend, StaleHandleError, lambda: ops.relu(t), "freed")
    refuses(backend, StaleHandleError, lambda: ops.add(live22, view), "b", "freed")
    refuses(backend, StaleHandleError, lambda: ops.reshape(t, (4, 1)), "freed")
    refuses(backend, StaleHandleError, lambda: ops.permute(view, (1, 0)), "freed")
    refuses(backend, StaleHandleError, lambda: ops.linear(live22, view), "weight", "freed")
    refuses(backend, StaleHandleError, lambda: ops.linear(live22, live22, t), "bias", "freed")
    refuses(backend, StaleHandleError, lambda: ops.layer_norm(live4, t), "weight", "freed")
    refuses(backend, StaleHandleError, lambda: ops.rms_norm(t, live4), "freed")
    refuses(backend, StaleHandleError, lambda: mm.free(t))
    refuses(backend, StaleHandleError, lambda: mm.copy_dtod(t, live4))
    refuses(backend, StaleHandleError, lambda: mm.copy_dtod(live4, t))
    with pytest.raises(StaleHandleError):
        await t.to_host()
    with pytest.raises(StaleHandleError):
        await view.to_host()


async def test_freed_buffers_raise_stale_handle(backend: ComputeBackend) -> None:
    mm = backend.memory_manager
    buf = mm.allocate(100)
    mm.free(buf)
    assert not buf.is_alive
    refuses(backend, StaleHandleError, lambda: mm.free(buf))
    with pytest.raises(StaleHandleError):
        await mm.copy_htod(buf, np.zeros(4, np.uint8))
    with pytest.raises(StaleHandleError):
        await mm.copy_dtoh(np.zeros(4, np.uint8), buf)


async def test_use_before_initialize(backend: ComputeBackend) -> None:
    fresh = accelkit.create_backend(backend.name)
    assert not fresh.is_ready
    for attr in (
        "tensor_ops",
        "tensor_factory",
        "memory_manager",
        "kernel_ops",
        "kernel_executor",
        "default_stream",
    ):
        with pytest.raises(NotInitializedError, match="never initialized"):
            getattr(fresh, attr)
    with pytest.raises(NotInitializedError, match="never initialized"):
        fresh.create_stream()
    with pytest.raises(NotInitializedError):
        await fresh.synchronize()
    assert fresh.status.state is accelkit.LifecycleState.CREATED
    await fresh.shutdown()  # a no-op on a backend never initialized


async def test_use_after_shutdown(backend: ComputeBackend) -> None:
    async with accelkit.open_backend(backend.name) as other:
        f, ops, mm = other.tensor_factory, other.tensor_ops, other.memory_manager
        t = f.ones((8,))
        buf = mm.allocate(64)
        stream = other.create_stream()
    assert other.status.state is accelkit.LifecycleState.SHUT_DOWN
    for attr in ("tensor_ops", "tensor_factory", "kernel_ops", "default_stream"):
        with pytest.raises(NotInitializedError, match="shut down"):
            getattr(other, attr)
    with pytest.raises(NotInitializedError, match="shut down"):
        other.create_stream()
    with pytest.raises(NotInitializedError):
        await other.synchronize()
    # One rule for tensors (docs/execution-model.md): a tensor that outlived its backend's
    # session is stale, whatever is done with it; the backend itself is not initialized.
    with pytest.raises(StaleHandleError, match="shut down"):
        await t.to_host()
    with pytest.raises(StaleHandleError, match="shut down"):
        t.numpy()
    with pytest.raises(StaleHandleError, match="shut down"):
        t + t
    with pytest.raises(StaleHandleError, match="shut down"):
        ops.relu(t)  # a component kept from before the shutdown
    with pytest.raises(NotInitializedError):
        f.zeros((2,))
    with pytest.raises(NotInitializedError):
        mm.allocate(16)
    with pytest.raises(NotInitializedError), other.use_stream(stream):
        pass
    assert not t.is_alive
    assert not buf.is_alive
    info = mm.memory_info()
    assert info.used == 0
    assert info.active_allocations == 0
    assert info.reserved == 0
    await other.shutdown()  # twice: a no-op
    # The backend under test is untouched by the other one's shutdown.
    np.testing.assert_array_equal(await fetch(backend.tensor_factory.ones((2,))), [1.0, 1.0])


async def test_unknown_backends_and_devices(backend: ComputeBackend) -> None:
    with pytest.raises(BackendNotFoundError, match="'nope'"):
        accelkit.create_backend("nope")
    with pytest.raises(BackendNotFoundError):
        async with accelkit.open_backend("nope"):
            pass
    with pytest.raises(InvalidArgumentError, match="'gpu:x'"):
        accelkit.create_backend("gpu:x")
    with pytest.raises(InvalidArgumentError, match="int"):
        accelkit.create_backend(5)  # type: ignore[arg-type]
    fresh = accelkit.create_backend(backend.name)
    with pytest.raises(UnsupportedOperationError, match="zz:0"):
        await fresh.initialize("zz:0")
    assert not fresh.is_ready
    with pytest.raises(InvalidArgumentError):
        await backend.synchronize("zz:3")
    assert not backend.supports_device("zz:0")
    assert backend.supports_device(cast(Device, backend.device))  # initialized: not None


# -- errors only a kernel can see -------------------------------------------------------------------
async def test_out_of_range_indices_surface_when_awaited(backend: ComputeBackend) -> None:
    f, ops, mm = backend.tensor_factory, backend.tensor_ops, backend.memory_manager
    baseline = mm.memory_info().used
    weight = f.ones((7, 4))
    y = ops.embedding(f.from_host([0, 9, 2]), weight)  # a submission: returns at once
    with pytest.raises(InvalidArgumentError, match="9"):
        await y.to_host()
    g = ops.gather(f.ones((3, 2)), 0, f.from_host([[0, 1], [5, 0]]))
    with pytest.raises(InvalidArgumentError, match="5"):
        await g.to_host()
    loss, _ = ops.cross_entropy(f.ones((2, 3)), f.from_host([1, 3]))
    with pytest.raises(InvalidArgumentError, match="3"):
        await loss.to_host()
    s = ops.scatter(f.ones((3, 2)), 0, f.from_host([[3, 0]]), 2.0)
    with pytest.raises(InvalidArgumentError, match="3"):
        await s.to_host()
    # Each error is reported once; the backend goes on working and accounting.
    await backend.synchronize()
    ok = ops.embedding(f.from_host([[6, 0]]), weight)
    np.testing.assert_array_equal(await fetch(ok), np.ones((1, 2, 4), np.float32))
    del y, g, loss, s, ok, weight, _
    assert mm.memory_info().used == baseline


async def test_kernel_error_surfaces_at_synchronize_if_not_awaited_directly(
    backend: ComputeBackend,
) -> None:
    f, ops = backend.tensor_factory, backend.tensor_ops
    bad = ops.embedding(f.from_host([-1]), f.ones((3, 2)))
    with pytest.raises(InvalidArgumentError, match="-1"):
        await backend.synchronize()
    del bad
    await backend.synchronize()  # reported once
