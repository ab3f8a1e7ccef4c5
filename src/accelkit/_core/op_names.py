"""The names of every operation, importable without NumPy (plugin probes and the selector use
them to describe capabilities before any backend is loaded)."""

from __future__ import annotations

__all__ = [
    "BINARY_OPS", "KERNEL_OPS", "KERNEL_OP_GROUPS", "REDUCE_OPS", "TENSOR_OPS", "UNARY_OPS",
]  # fmt: skip

#: unary op -> "float" (integer input gives F32) or "same" (keeps the dtype)
UNARY_OPS: dict[str, str] = {
    "relu": "same", "abs": "same", "neg": "same", "floor": "same", "ceil": "same",
    "round": "same", "sigmoid": "float", "tanh": "float", "exp": "float", "log": "float",
    "sqrt": "float", "rsqrt": "float", "sin": "float", "cos": "float", "tan": "float",
    "erf": "float", "gelu": "float", "gelu_tanh": "float", "silu": "float",
}  # fmt: skip
#: binary op -> "arith", "div" or "compare"
BINARY_OPS: dict[str, str] = {
    "add": "arith", "sub": "arith", "mul": "arith", "div": "div", "maximum": "arith",
    "minimum": "arith", "pow": "arith", "mod": "arith", "eq": "compare", "ne": "compare",
    "lt": "compare", "le": "compare", "gt": "compare", "ge": "compare",
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
        "sharpen",
    }
)  # fmt: skip

#: KernelOps sub-interface attribute -> the fused ops it provides.
KERNEL_OP_GROUPS: dict[str, tuple[str, ...]] = {
    "norm_ops": ("rms_norm", "rms_norm_residual", "layer_norm"),
    "position_ops": ("rotary_embedding",),
    "attention_ops": ("attention", "paged_attention"),
    "activation_ops": ("silu_mul", "gelu"),
    "linear_ops": ("linear", "quantized_linear"),
    "sampling_ops": ("argmax", "sample_token"),
}
#: Names of every KernelOps operation, as listed in capabilities.
KERNEL_OPS: frozenset[str] = frozenset(op for ops in KERNEL_OP_GROUPS.values() for op in ops)
