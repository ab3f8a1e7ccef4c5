"""64-bit integers in WGSL, which has none: I64 and U64 values as ``vec2<u32>`` (low word, high
word), two's complement, with the operations accelkit's kernels need.

Every function here is exact: addition, subtraction and multiplication wrap modulo 2^64 as NumPy's
do; division, remainders and powers follow the elementwise table's rules (``x // 0 == 0``,
``INT_MIN // -1`` wraps); conversions to f32 round once, to nearest even, from the exact value;
conversions from f32 truncate toward zero and give 0 outside the target's range or for NaN (the
backend's cast rule). The suffix ``_s`` marks the signed (I64) variant, ``_u`` the unsigned one.
"""

from __future__ import annotations

__all__ = ["INT64"]

INT64 = """
fn w_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn w_sub(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}
fn w_neg(a: vec2<u32>) -> vec2<u32> { return w_sub(vec2<u32>(0u, 0u), a); }
fn w_mul32(a: u32, b: u32) -> vec2<u32> {
    // the full 64-bit product of two u32, through 16-bit halves
    let a0 = a & 0xffffu; let a1 = a >> 16u;
    let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}
fn w_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let p = w_mul32(a.x, b.x);
    return vec2<u32>(p.x, p.y + a.x * b.y + a.y * b.x);
}
fn w_is_neg(a: vec2<u32>) -> bool { return (a.y & 0x80000000u) != 0u; }
fn w_eq(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x == b.x && a.y == b.y; }
fn w_lt_u(a: vec2<u32>, b: vec2<u32>) -> bool { return a.y < b.y || (a.y == b.y && a.x < b.x); }
fn w_lt_s(a: vec2<u32>, b: vec2<u32>) -> bool {
    let ha = bitcast<i32>(a.y); let hb = bitcast<i32>(b.y);
    return ha < hb || (ha == hb && a.x < b.x);
}
fn w_abs(a: vec2<u32>) -> vec2<u32> { return select(a, w_neg(a), w_is_neg(a)); }
fn w_shl(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n >= 64u) { return vec2<u32>(0u, 0u); }
    if (n >= 32u) { return vec2<u32>(0u, a.x << (n - 32u)); }
    if (n == 0u) { return a; }
    return vec2<u32>(a.x << n, (a.y << n) | (a.x >> (32u - n)));
}
fn w_shr_u(a: vec2<u32>, n: u32) -> vec2<u32> {
    if (n >= 64u) { return vec2<u32>(0u, 0u); }
    if (n >= 32u) { return vec2<u32>(a.y >> (n - 32u), 0u); }
    if (n == 0u) { return a; }
    return vec2<u32>((a.x >> n) | (a.y << (32u - n)), a.y >> n);
}
fn w_shr_s(a: vec2<u32>, n: u32) -> vec2<u32> {
    let fill = select(0u, 0xffffffffu, w_is_neg(a));
    if (n >= 64u) { return vec2<u32>(fill, fill); }
    if (n >= 32u) {
        return vec2<u32>(bitcast<u32>(bitcast<i32>(a.y) >> (n - 32u)), fill);
    }
    if (n == 0u) { return a; }
    return vec2<u32>((a.x >> n) | (a.y << (32u - n)), bitcast<u32>(bitcast<i32>(a.y) >> n));
}
// unsigned division and remainder by shift-subtract (b != 0)
fn w_divmod_u(a: vec2<u32>, b: vec2<u32>) -> array<vec2<u32>, 2> {
    var q = vec2<u32>(0u, 0u);
    var r = vec2<u32>(0u, 0u);
    for (var i = 0u; i < 64u; i = i + 1u) {
        let bit = 63u - i;
        r = w_shl(r, 1u);
        let word = select(a.x, a.y, bit >= 32u);
        r.x = r.x | ((word >> (bit & 31u)) & 1u);
        if (!w_lt_u(r, b)) {
            r = w_sub(r, b);
            if (bit >= 32u) { q.y = q.y | (1u << (bit - 32u)); } else { q.x = q.x | (1u << bit); }
        }
    }
    return array<vec2<u32>, 2>(q, r);
}
fn w_is_zero(a: vec2<u32>) -> bool { return a.x == 0u && a.y == 0u; }
fn w_is_m1(a: vec2<u32>) -> bool { return a.x == 0xffffffffu && a.y == 0xffffffffu; }
// floor division and floor modulo (NumPy's // and %), and C's truncated ones (fmod)
fn w_floordiv_s(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (w_is_zero(b)) { return vec2<u32>(0u, 0u); }
    if (w_is_m1(b)) { return w_neg(a); }
    let qr = w_divmod_u(w_abs(a), w_abs(b));
    var q = qr[0];
    let neg = w_is_neg(a) != w_is_neg(b);
    if (neg) {
        q = w_neg(q);
        if (!w_is_zero(qr[1])) { q = w_sub(q, vec2<u32>(1u, 0u)); }
    }
    return q;
}
fn w_mod_s(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (w_is_zero(b) || w_is_m1(b)) { return vec2<u32>(0u, 0u); }
    let qr = w_divmod_u(w_abs(a), w_abs(b));
    var r = select(qr[1], w_neg(qr[1]), w_is_neg(a));
    if (!w_is_zero(r) && (w_is_neg(r) != w_is_neg(b))) { r = w_add(r, b); }
    return r;
}
fn w_fmod_s(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (w_is_zero(b) || w_is_m1(b)) { return vec2<u32>(0u, 0u); }
    let qr = w_divmod_u(w_abs(a), w_abs(b));
    return select(qr[1], w_neg(qr[1]), w_is_neg(a));
}
fn w_floordiv_u(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (w_is_zero(b)) { return vec2<u32>(0u, 0u); }
    return w_divmod_u(a, b)[0];
}
fn w_mod_u(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (w_is_zero(b)) { return vec2<u32>(0u, 0u); }
    return w_divmod_u(a, b)[1];
}
fn w_pow(a0: vec2<u32>, b0: vec2<u32>, signed: bool) -> vec2<u32> {
    if (signed && w_is_neg(b0)) {
        if (w_eq(a0, vec2<u32>(1u, 0u))) { return a0; }
        if (w_is_m1(a0)) { return select(vec2<u32>(1u, 0u), a0, (b0.x & 1u) == 1u); }
        return vec2<u32>(0u, 0u);
    }
    var r = vec2<u32>(1u, 0u);
    var a = a0;
    var b = b0;
    loop {
        if (w_is_zero(b)) { break; }
        if ((b.x & 1u) == 1u) { r = w_mul(r, a); }
        a = w_mul(a, a);
        b = w_shr_u(b, 1u);
    }
    return r;
}
// conversions
fn w_from_i32(v: i32) -> vec2<u32> {
    return vec2<u32>(bitcast<u32>(v), select(0u, 0xffffffffu, v < 0));
}
fn w_from_u32(v: u32) -> vec2<u32> { return vec2<u32>(v, 0u); }
fn w_to_f32_u(a: vec2<u32>) -> f32 {
    // round once to nearest even from the exact 64-bit value
    if (a.y == 0u) {
        if (a.x < 16777216u) { return f32(a.x); }
    }
    let lz = select(countLeadingZeros(a.y), 32u + countLeadingZeros(a.x), a.y == 0u);
    let top = 63u - lz;                      // index of the leading bit (>= 24 here)
    let shift = top - 23u;                   // bits below the 24-bit mantissa
    let m = w_shr_u(a, shift).x;             // 24 bits
    let rest = w_sub(a, w_shl(vec2<u32>(m, 0u), shift));
    let half = w_shl(vec2<u32>(1u, 0u), shift - 1u);
    var mant = m;
    var e = top;
    if (w_lt_u(half, rest) || (w_eq(rest, half) && (m & 1u) == 1u)) {
        mant = mant + 1u;
        if (mant == 16777216u) { mant = 8388608u; e = e + 1u; }
    }
    return bitcast<f32>(((e + 127u) << 23u) | (mant & 0x7fffffu));
}
fn w_to_f32_s(a: vec2<u32>) -> f32 {
    let m = w_to_f32_u(w_abs(a));
    return select(m, -m, w_is_neg(a));
}
fn w_from_f32(v: f32, signed: bool) -> vec2<u32> {
    // truncate toward zero; NaN and values outside the target's range give 0
    let t = trunc(v);
    let bits = bitcast<u32>(v) & 0x7fffffffu;
    if (bits > 0x7f800000u) { return vec2<u32>(0u, 0u); }
    if (signed) {
        if (t < -9223372036854775808.0 || t >= 9223372036854775808.0) { return vec2<u32>(0u, 0u); }
    } else {
        if (t < 0.0 || t >= 18446744073709551616.0) { return vec2<u32>(0u, 0u); }
    }
    let m = abs(t);
    let hi = floor(m / 4294967296.0);
    let lo = m - hi * 4294967296.0;
    let w = vec2<u32>(u32(lo), u32(hi));
    return select(w, w_neg(w), t < 0.0);
}
fn w_to_index(a: vec2<u32>) -> i32 {
    // an index as i32; a value outside i32's range becomes i32's minimum (always out of range)
    let v = bitcast<i32>(a.x);
    if (a.y != select(0u, 0xffffffffu, v < 0)) { return i32(-2147483647 - 1); }
    return v;
}
"""
