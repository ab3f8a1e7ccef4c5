"""The 2-d convolution kernel (NCHW cross-correlation with stride, padding, dilation, groups).

A direct convolution: one work-item per output element, over the (OW, OH, N*O) grid, sums its
input window in float (double for F64), so F16 accumulates in float as the other kernels do.
Zero padding is the bounds check on each tap; the rows of taps outside the image are skipped
before the inner loop.
"""

from __future__ import annotations

from accelkit.dtype import DType
from accelkit_opencl.opencl_types import STORE_TYPES, load_type, pragmas

__all__ = ["conv2d_source"]


def conv2d_source(dtype: DType, has_bias: bool) -> str:
    """Kernel ``conv2d(out, x, weight, [bias], C, H, W, O, CG, KH, KW, OH, OW, sh, sw, ph, pw,
    dh, dw, OG)`` (all ints; ``CG`` input and ``OG`` output channels per group)."""
    t = STORE_TYPES[dtype]
    acc = load_type(dtype)
    params = [f"__global {t}* out", f"__global const {t}* x", f"__global const {t}* w"]
    if has_bias:
        params.append(f"__global const {t}* bias")
    params += [
        f"int {p}"
        for p in (
            "C", "H", "W", "O", "CG", "KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw",
            "OG",
        )
    ]  # fmt: skip
    bias = "    sum += (ACC)bias[o];\n" if has_bias else ""
    return (
        pragmas([t, acc])
        + f"#define T {t}\n#define ACC {acc}\n"
        + f"__kernel void conv2d({', '.join(params)}) {{\n"
        + _BODY
        + bias
        + "    out[(no * OH + oh) * OW + ow] = (T)sum;\n}\n"
    )


_BODY = """\
    int ow = get_global_id(0);
    int oh = get_global_id(1);
    long no = get_global_id(2);
    if (ow >= OW || oh >= OH) return;
    int o = (int)(no % O);
    long n = no / O;
    int g = o / OG;
    int ih0 = oh * sh - ph;
    int iw0 = ow * sw - pw;
    __global const T* xp = x + (n * C + (long)g * CG) * H * W;
    __global const T* wp = w + (long)o * CG * KH * KW;
    ACC sum = (ACC)0;
    for (int c = 0; c < CG; ++c) {
        __global const T* xc = xp + (long)c * H * W;
        __global const T* wc = wp + c * KH * KW;
        for (int kh = 0; kh < KH; ++kh) {
            int ih = ih0 + kh * dh;
            if (ih < 0 || ih >= H) continue;
            __global const T* xr = xc + (long)ih * W;
            __global const T* wr = wc + kh * KW;
            for (int kw = 0; kw < KW; ++kw) {
                int iw = iw0 + kw * dw;
                if (iw >= 0 && iw < W) sum += (ACC)xr[iw] * (ACC)wr[kw];
            }
        }
    }
"""
