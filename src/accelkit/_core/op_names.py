"""The names of every operation, importable without NumPy (plugin probes and the selector use
them to describe capabilities before any backend is loaded)."""

from __future__ import annotations

__all__ = [
    "BINARY_OPS", "COMPOSED_OPS", "KERNEL_OPS", "KERNEL_OPS_IN_ORDER", "REDUCE_OPS", "TENSOR_OPS", "UNARY_OPS",
]  # fmt: skip

#: unary op -> "float" (integer input gives F32), "same" (keeps the dtype) or "int" (integer
#: and bool only, keeps the dtype)
UNARY_OPS: dict[str, str] = {
    "relu": "same", "abs": "same", "neg": "same", "floor": "same", "ceil": "same",
    "round": "same", "sigmoid": "float", "tanh": "float", "exp": "float", "log": "float",
    "sqrt": "float", "rsqrt": "float", "sin": "float", "cos": "float", "tan": "float",
    "erf": "float", "gelu": "float", "gelu_tanh": "float", "silu": "float",
    "bitwise_not": "int",
}  # fmt: skip
#: binary op -> "arith" (promoted dtype), "div" (true division: integers give F32), "compare"
#: (BOOL), "intdiv" (promoted dtype, bool refused), "bitwise" (integer and bool only) or
#: "shift" (integer only)
BINARY_OPS: dict[str, str] = {
    "add": "arith", "sub": "arith", "mul": "arith", "div": "div", "maximum": "arith",
    "minimum": "arith", "pow": "arith", "mod": "arith", "eq": "compare", "ne": "compare",
    "lt": "compare", "le": "compare", "gt": "compare", "ge": "compare",
    "floor_divide": "intdiv", "fmod": "intdiv", "bitwise_and": "bitwise",
    "bitwise_or": "bitwise", "bitwise_xor": "bitwise", "left_shift": "shift",
    "right_shift": "shift",
}  # fmt: skip
REDUCE_OPS = ("sum", "mean", "max", "min", "prod", "argmax", "argmin")

#: Names of every TensorOps operation, as listed in capabilities.
TENSOR_OPS: frozenset[str] = frozenset(
    {*UNARY_OPS, *BINARY_OPS, *REDUCE_OPS}
    | {
        "unary", "binary", "where", "cast", "gemm", "batched_gemm", "matmul", "linear",
        "conv2d", "attention", "softmax", "log_softmax", "layer_norm", "rms_norm",
        "cross_entropy", "embedding", "adam_update", "reduce", "reshape", "transpose",
        "permute", "concat", "split", "stack", "narrow", "gather", "scatter", "gaussian_blur",
        "sobel_edges", "grayscale", "threshold", "brightness", "contrast", "invert_colors",
        "sharpen", "pad", "broadcast_to", "tile", "flip", "tril", "triu", "one_hot",
        "cumsum", "cumprod", "sort", "argsort", "topk", "max_pool2d", "avg_pool2d",
        "adaptive_avg_pool2d", "conv1d", "conv_transpose2d", "batch_norm", "group_norm",
        "instance_norm", "layer_norm_with_stats", "rms_norm_with_stats", "mse_loss",
        "binary_cross_entropy_with_logits", "index_add", "gather_nd", "scatter_nd",
        "apply_rotary",
    }
)  # fmt: skip

#: TensorOps the core writes as compositions of other TensorOps (the optional kernels ``take``,
#: ``cumulative`` and ``argsort`` speed them up where a backend has them): a backend that runs
#: the ops they are made of on its device may claim these too.
COMPOSED_OPS: frozenset[str] = frozenset(
    {
        "pad", "broadcast_to", "tile", "flip", "tril", "triu", "one_hot", "cumsum", "cumprod",
        "sort", "argsort", "topk", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "conv1d",
        "conv_transpose2d", "batch_norm", "group_norm", "instance_norm", "layer_norm_with_stats",
        "rms_norm_with_stats", "mse_loss", "binary_cross_entropy_with_logits", "index_add",
        "gather_nd", "scatter_nd", "apply_rotary",
    }
)  # fmt: skip

#: Every KernelOps operation, in KernelOps's order (norms, position, attention, activations,
#: linear, sampling).
KERNEL_OPS_IN_ORDER: tuple[str, ...] = (
    "rms_norm", "rms_norm_residual", "layer_norm", "rotary_embedding", "attention",
    "paged_attention", "silu_mul", "gelu", "linear", "quantized_linear", "argmax", "sample_token",
)  # fmt: skip
#: Names of every KernelOps operation, as listed in capabilities.
KERNEL_OPS: frozenset[str] = frozenset(KERNEL_OPS_IN_ORDER)
