"""A FlashAttention-2-style tensor-core attention kernel (NVRTC), the fallback where cuDNN is absent.

The kernel follows FlashAttention-2's forward pass (Dao, 2023): each block of 128 threads (four
warps) owns 64 query rows, each warp 16 of them; the block streams the keys and values in tiles of
64 rows through shared memory and keeps the softmax statistics and the output accumulator in
registers, so no score matrix is ever stored. The products run on the tensor cores as
``mma.sync.aligned.m16n8k16`` (f16 or bf16 inputs, f32 accumulation):

- ``S = Q K^T``: Q's fragments are read once with ``ldmatrix`` and kept in registers; K's with
  ``ldmatrix`` (K's rows are the B operand's columns).
- The online softmax works on the accumulator fragments in registers (row maxima and sums
  reduced across the four lanes sharing a row), in the log2 domain (``exp2``).
- ``O += P V``: P's f32 accumulator fragments are rounded to the input type and reused as the A
  operand directly (the m16n8 C layout of two adjacent key tiles is the m16k16 A layout); V's
  fragments come from ``ldmatrix.trans``.
- Q, K and V tiles are copied into shared memory with ``cp.async`` (16 bytes a copy, rows past
  the end zero-filled), K and V double-buffered: the next tile is in flight while the current one
  is computed. Shared rows are padded by 16 bytes, so ``ldmatrix`` meets no bank conflict.
- Causal attention (aligned to the last key, as the old kernel and the composition) stops at
  the last key tile any row of the block can see, and masks only the tiles that cross the
  diagonal or the end of the keys; the blocks of the longest rows are scheduled first.
- Grouped KV heads: query head ``h`` reads KV head ``h // (H / Hkv)``.

It covers f16 and bf16 with ``head_dim == head_dim_v`` of 64 or 128 on compute capability 8.0
and up (``mma.sync`` m16n8k16 with bf16, ``cp.async`` and ``ldmatrix`` are sm_80 instructions).
Everything else keeps the warp-per-row kernel of :mod:`accelkit_cuda.cuda_fused`.

The backend never trusts that the kernel is right on the device at hand: :meth:`Flash2Attention.
load` (awaited at ``initialize``) compiles it, then runs every variant once on small random
inputs (odd lengths, grouped heads, causal and not) against a NumPy float64 reference with the
tolerance of :func:`tolerance`, in a child process (a kernel that faults there cannot poison the
backend's CUDA context); the verdict is stored (:func:`verdict_folder`), keyed by the binary,
the device's name, compute capability and driver. A variant that fails, or a device where the
kernel cannot run, leaves the old kernel in place, and the backend's ``prepare()`` note and its
capabilities (``extra["flash2_attention"]``) say why. ``ACCELKIT_CUDA_FLASH2=0`` switches it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from accelkit.dtype import DType
from accelkit.sdk import env_str
from accelkit_cuda.driver import Attr, DeviceProps

if TYPE_CHECKING:
    from accelkit.tensor import Tensor

__all__ = [
    "BLOCK_M",
    "BLOCK_N",
    "HEAD_DIMS",
    "SOURCE",
    "THREADS",
    "Flash2Attention",
    "Flash2State",
    "GatedKernel",
    "arch_supported",
    "check_child",
    "geometry",
    "kernel_name",
    "kernel_names",
    "launch_args",
    "reference",
    "shared_bytes",
    "tolerance",
    "verdict",
    "verdict_folder",
]

BLOCK_M = 64  # query rows per block (16 per warp)
BLOCK_N = 64  # key rows per shared-memory tile
THREADS = 128  # four warps
HEAD_DIMS = (64, 128)
_PAD = 8  # elements of padding per shared row (16 bytes: conflict-free ldmatrix)
_SUFFIX = {DType.F16: "f16", DType.BF16: "bf16"}
_LOG2E = 1.4426950408889634
_GRID_Y_MAX = 65535

Flash2State = Literal["unverified", "verified", "failed", "unavailable"]


def kernel_name(dtype: DType, head_dim: int) -> str:
    """The entry point of one variant, e.g. ``fa2_f16_d128``."""
    return f"fa2_{_SUFFIX[dtype]}_d{head_dim}"


def kernel_names() -> list[str]:
    """Every variant's entry point."""
    return [kernel_name(dt, d) for dt in _SUFFIX for d in HEAD_DIMS]


def shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block: Q's tile and two K and two V tiles, rows padded."""
    return (BLOCK_M + 4 * BLOCK_N) * (head_dim + _PAD) * 2


def arch_supported(arch: str) -> bool:
    """Whether ``arch`` (``"sm_90"``) has the sm_80 instructions the kernel uses."""
    digits = arch.removeprefix("sm_").removeprefix("compute_").rstrip("af")
    return digits.isdigit() and int(digits) >= 80


def geometry(
    batch: int, heads: int, seq_q: int, head_dim: int
) -> tuple[tuple[int, int], tuple[int], int]:
    """``(grid, block, shared_bytes)`` of one launch: one block per 64 query rows of each
    (batch, head) pair."""
    return ((seq_q + BLOCK_M - 1) // BLOCK_M, batch * heads), (THREADS,), shared_bytes(head_dim)


def launch_args(
    q: Any, k: Any, v: Any, out: Any, heads: int, kv_heads: int, seq_q: int, seq_k: int,
    scale: float, causal: bool, seq_major: bool = False,
) -> tuple[Any, ...]:  # fmt: skip
    """The kernel's arguments in its parameter order (pointers as given; the scale folded into
    the log2 domain the kernel's softmax works in); ``seq_major``: q, k, v and out are stored
    [B, S, H, D] (``attention_bshd``)."""
    return (
        q, k, v, out, np.int32(heads), np.int32(kv_heads), np.int64(seq_q), np.int64(seq_k),
        np.float32(scale * _LOG2E), np.int32(bool(causal)), np.int32(bool(seq_major)),
    )  # fmt: skip


def tolerance(dtype: DType, seq_k: int, head_dim: int) -> float:
    """The largest error of one output element, relative to ``max |v|``.

    The inputs are exact in the reference (it reads the same rounded values). The kernel rounds
    each probability once to ``dtype`` before ``P V`` (relative error <= u = eps/2 each, so the
    weighted mean moves by <= u max|v|, the denominator being summed unrounded) and rounds the
    output once (<= u |o| <= u max|v|): eps in all. The f32 accumulations add at most
    (seq_k + head_dim) f32 epsilons (the scores' and the sums' rounding, exp2's few ulp). Twice
    that, for safety; a wrong fragment layout or mask is off by O(1)."""
    eps = 2.0**-10 if dtype is DType.F16 else 2.0**-7
    return 2.0 * (eps + (seq_k + head_dim) * 2.0**-23)


def reference(
    q: np.ndarray[Any, Any], k: np.ndarray[Any, Any], v: np.ndarray[Any, Any], scale: float,
    causal: bool,
) -> np.ndarray[Any, Any]:  # fmt: skip
    """Attention in float64 on the host: [B, H, Sq, D] x [B, Hkv, Sk, D] -> [B, H, Sq, D];
    causal aligned to the last key; a row that sees no key is zero."""
    h, hk = q.shape[1], k.shape[1]
    qf, kf, vf = (a.astype(np.float64) for a in (q, k, v))
    kf, vf = np.repeat(kf, h // hk, axis=1), np.repeat(vf, h // hk, axis=1)
    s = qf @ np.swapaxes(kf, -1, -2) * scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    total = p.sum(-1, keepdims=True)
    return np.where(total > 0, (p @ vf) / np.where(total > 0, total, 1.0), 0.0)


def to_bits(x: np.ndarray[Any, Any], dtype: DType) -> np.ndarray[Any, Any]:
    """``x`` rounded to f16 or bf16 (to nearest even), as its 16-bit patterns."""
    if dtype is DType.F16:
        return np.ascontiguousarray(x, np.float32).astype(np.float16).view(np.uint16)
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return rounded.astype(np.uint16)  # (finite inputs: no NaN payloads to keep)


def from_bits(bits: np.ndarray[Any, Any], dtype: DType) -> np.ndarray[Any, Any]:
    """The values of f16 or bf16 bit patterns, as float64."""
    if dtype is DType.F16:
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


#: The shapes of the on-device check: (batch, heads, kv_heads, seq_q, seq_k, causal). Odd
#: lengths (no multiple of a tile), several tiles of each, grouped heads, queries longer than
#: the keys under the causal mask (rows that see no key).
CHECK_SHAPES: tuple[tuple[int, int, int, int, int, bool], ...] = (
    (1, 4, 2, 70, 133, False),
    (2, 2, 1, 131, 131, True),
    (1, 2, 2, 97, 45, True),
)


class GatedKernel:
    """A kernel used only once it passed its on-device check (a child process, the verdict
    stored): the state and the steps the tensor-core kernel, the split-KV decode kernel and
    the tiled f32 kernel share."""

    def __init__(self, backend: Any, props: DeviceProps) -> None:
        self._backend = backend
        self._props = props
        self.state: Flash2State = "unverified"
        #: Why the kernel is not used (empty when verified).
        self.reason = "not loaded yet"
        self._functions: dict[str, Any] = {}
        #: False routes every call to the other engines (a verified kernel stays loaded): for
        #: comparisons such as ``benchmarks/bench_cuda_flash.py``.
        self.enabled = True

    @property
    def verified(self) -> bool:
        """Whether the kernel passed its on-device check here (and is loaded)."""
        return self.state == "verified"

    def describe(self) -> str:
        """One line for notes and capabilities."""
        return "verified" if self.verified else f"{self.state}: {self.reason}"

    def lacks_shared_memory(self, need: int) -> bool:
        """Whether a block of ``need`` bytes of shared memory is more than the device allows
        (the kernel is then unavailable, and :attr:`reason` says so)."""
        optin = self._props.attr(Attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if optin >= need:
            return False
        self.state = "unavailable"
        self.reason = f"a block needs {need} bytes of shared memory; the device allows {optin}"
        return True

    def gate_refusal(self, what: str) -> str | None:
        """Why no call can take the kernel now (``what`` names it), or None."""
        if self.state != "verified":
            return f"the {what} is {self.describe()}"
        if not self.enabled:
            return f"the {what} is switched off for this backend (enabled = False)"
        return None

    async def compile_check_load(
        self, source: str, filename: str, module: str, prefix: str, recheck: bool,
        load: Callable[[bytes], dict[str, Any]],
    ) -> None:  # fmt: skip
        """The gate's steps once a kernel's own preconditions hold: compile ``source`` (a
        worker thread; cached on disk), check it on the device in a child running ``python -m
        module`` (a worker thread waits for it; the verdict stored under ``prefix``, reused
        unless ``recheck``: :func:`verdict`), then ``load`` it on the submission thread. Never
        raises: a failure sets :attr:`state` and :attr:`reason`."""
        import anyio

        try:
            from accelkit_cuda.nvrtc import compile_cached

            arch: str = self._backend._arch
            compiled = await anyio.to_thread.run_sync(compile_cached, source, arch, (), filename)
        except Exception as exc:
            self.state, self.reason = "unavailable", f"compiling failed: {exc}"
            return

        def check() -> str | None:
            return verdict(
                compiled.binary, self._props, module=module, prefix=prefix, recheck=recheck
            )

        failure = await anyio.to_thread.run_sync(check)
        if failure is not None:
            self.state, self.reason = "failed", f"the on-device check failed: {failure}"
            return
        try:
            self._functions = await self._backend.thread.call(lambda: load(compiled.binary))
        except Exception as exc:
            self.state, self.reason = "unavailable", f"loading failed: {exc}"
            return
        self.state, self.reason = "verified", ""


class Flash2Attention(GatedKernel):
    """The tensor-core kernel of one backend: compiled, checked on the device and loaded by
    :meth:`load`; :meth:`refusal` says whether a call can take it."""

    async def load(self) -> None:
        """Compile (a worker thread; cached on disk), check on the device in a child process
        (a worker thread waits for it; the verdict is stored in :func:`verdict_folder`, so a
        later run on the same device and driver skips it), then load and set the shared-memory
        limit on the submission thread. Never raises: a failure leaves the old kernel in use
        and says why. The check runs in a child so that a kernel that faults on this device
        cannot poison this process's CUDA context."""
        backend = self._backend
        arch: str = backend._arch
        if env_str("ACCELKIT_CUDA_FLASH2") in ("0", "off", "false", "no"):
            self.state, self.reason = "unavailable", "switched off (ACCELKIT_CUDA_FLASH2=0)"
            return
        if not arch_supported(arch):
            self.state = "unavailable"
            self.reason = f"{arch} lacks mma.sync bf16, cp.async and ldmatrix (sm_80 or newer)"
            return
        if self.lacks_shared_memory(shared_bytes(max(HEAD_DIMS))):
            return
        await self.compile_check_load(
            SOURCE, "accelkit_flash2.cu", "accelkit_cuda.flash_attention", "flash2",
            env_str("ACCELKIT_CUDA_FLASH2") == "recheck", _load,
        )  # fmt: skip

    def refusal(self, q: Tensor, k: Tensor, v: Tensor, seq_major: bool = False) -> str | None:
        """None when the kernel takes ``attention(q, k, v)`` without a mask (stored
        [B, S, H, D] with ``seq_major``), else why not."""
        gate = self.gate_refusal("tensor-core kernel")
        if gate is not None:
            return gate
        dt = q.dtype
        if dt not in _SUFFIX:
            return f"the tensor-core kernel takes f16/bf16, not {dt.value}"
        qs, ks = stored_shape(q.shape, seq_major), stored_shape(k.shape, seq_major)
        d, dv = qs[3], v.shape[3]
        if d != dv or d not in HEAD_DIMS:
            return (
                f"the tensor-core kernel takes head_dim == head_dim_v in {HEAD_DIMS}; got {d}/{dv}"
            )
        if q.size == 0 or ks[2] == 0:
            return "empty attention"
        if qs[0] * qs[1] > _GRID_Y_MAX:
            return f"batch * heads > {_GRID_Y_MAX}"
        return None

    def function(self, dtype: DType, head_dim: int) -> Any:
        """The loaded variant (a dict lookup)."""
        return self._functions[kernel_name(dtype, head_dim)]


def verdict(
    binary: bytes, props: DeviceProps, timeout: float = 180.0, *,
    module: str = "accelkit_cuda.flash_attention", prefix: str = "flash2",
    recheck: bool | None = None,
) -> str | None:  # fmt: skip
    """The on-device check of ``binary`` on ``props``'s device: None when it passed, else why
    not. A stored verdict for the same binary, device name, compute capability and driver is
    reused (``ACCELKIT_CUDA_FLASH2=recheck`` ignores it); otherwise a child process runs
    :func:`_check` (blocking: call it off the loop). A check that ran to its end (passed,
    failed, or crashed: a kernel fault) is stored; one that timed out or could not start is
    not, and runs again next time. ``module`` is the child's (``python -m MODULE DEVICE
    CUBIN``; :mod:`accelkit_cuda.flash_decode` checks its kernel this way too), ``prefix`` the
    stored file's, ``recheck`` (default: ``ACCELKIT_CUDA_FLASH2=recheck``) ignores a stored
    verdict."""
    ident = "\0".join(
        (props.name, "{}.{}".format(*props.compute_capability), str(props.driver_version))
    )
    key = hashlib.sha256(binary + b"\0" + ident.encode()).hexdigest()
    path = verdict_folder() / f"{prefix}-{key}.verdict"
    if recheck is None:
        recheck = env_str("ACCELKIT_CUDA_FLASH2") == "recheck"
    if not recheck:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, RecursionError):
            stored = json.loads(path.read_text())
            ok, reason = bool(stored["ok"]), str(stored["reason"])
            return None if ok else f"{reason} (a stored verdict: {path.name})"
    failure, ran = _run_child(binary, props.index, timeout, module)
    if ran:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"ok": failure is None, "reason": failure or ""}))
            os.replace(tmp, path)
    return failure


def verdict_folder() -> Path:
    """Where verdicts are stored: ``$ACCELKIT_CUDA_VERDICTS``, or ``cuda-verdicts/`` under
    :func:`accelkit.calibration.cache_dir` (one file per verdict, written atomically)."""
    override = env_str("ACCELKIT_CUDA_VERDICTS")
    if override:
        return Path(override)
    from accelkit.calibration import cache_dir

    return cache_dir() / "cuda-verdicts"


def _run_child(
    binary: bytes, device: int, timeout: float, module: str = "accelkit_cuda.flash_attention"
) -> tuple[str | None, bool]:
    """Run ``module``'s ``main`` in a child: (None or why it failed, whether the check ran to
    its end)."""
    with tempfile.TemporaryDirectory(prefix="accelkit-flash2-") as folder:
        cubin = Path(folder) / "kernel.cubin"
        cubin.write_bytes(binary)
        cmd = [sys.executable, "-m", module, str(device), str(cubin)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"the check did not finish in {timeout:.0f} s", False
        except OSError as exc:
            return f"the check could not start: {exc}", False
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            failure = json.loads(lines[-1])["failure"]
            return (None if failure is None else str(failure)), True
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return f"the check exited with {done.returncode}: {tail}", True


def check_child(
    argv: list[str],
    load: Callable[[bytes], dict[str, Any]],
    check: Callable[[dict[str, Any]], str | None],
) -> int:
    """The body of a :func:`verdict` child (``python -m MODULE DEVICE CUBIN``): on device
    ``argv[1]``, ``check(load(cubin))``; prints ``{"failure": null}`` or ``{"failure": "why"}``
    as its last line."""
    import cupy as cp

    with cp.cuda.Device(int(argv[1])):
        failure = check(load(Path(argv[2]).read_bytes()))
    print(json.dumps({"failure": failure}))
    return 0


def main(argv: list[str]) -> int:
    """The child of :func:`verdict` for this kernel: ``python -m accelkit_cuda.flash_attention
    DEVICE CUBIN`` (:func:`check_child`)."""
    return check_child(argv, _load, _check)


def _load(binary: bytes) -> dict[str, Any]:
    """On the submission thread: load the module, look up every variant and raise its dynamic
    shared-memory limit where it needs more than the default 48 KiB."""
    import cupy as cp

    module = cp.cuda.function.Module()
    module.load(binary)
    functions = {"": module}
    for name in kernel_names():
        fn = module.get_function(name)
        need = shared_bytes(int(name.rsplit("_d", 1)[1]))
        if need > 48 * 1024:
            driver = cp.cuda.driver
            attr = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
            driver.funcSetAttribute(fn.ptr, attr, need)
        functions[name] = fn
    return functions


def stored(x: np.ndarray[Any, Any], seq_major: bool) -> np.ndarray[Any, Any]:
    """A head-major [B, H, S, D] array as a kernel stores it: itself, or with ``seq_major`` a
    contiguous [B, S, H, D] copy (the same call turns a stored one back to head-major)."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if seq_major else x


def stored_shape(shape: tuple[int, ...], seq_major: bool) -> tuple[int, ...]:
    """The shape a head-major [B, H, S, D] is stored in: itself, or with ``seq_major``
    [B, S, H, D]. Axes 1 and 2 swapped is its own inverse: it also gives a stored tensor's
    head-major shape."""
    if not seq_major:
        return shape
    b, h, s, d = shape
    return b, s, h, d


def check_cases(
    shapes: tuple[tuple[int, int, int, int, int, bool], ...],
) -> list[tuple[tuple[int, int, int, int, int, bool], bool]]:
    """An on-device check's cases: every shape head-major and sequence-major
    (``attention_bshd``'s strides), as ``(shape, seq_major)``."""
    return [(shape, major) for major in (False, True) for shape in shapes]


def _check(functions: dict[str, Any]) -> str | None:
    """On the submission thread: every variant on :data:`CHECK_SHAPES` against :func:`reference`
    (a private stream, synchronized). Returns None, or the first failure."""
    import cupy as cp

    rng = np.random.default_rng(29)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for dtype in _SUFFIX:
            for d in HEAD_DIMS:
                for (b, h, hk, sq, sk, causal), major in check_cases(CHECK_SHAPES):
                    host = [
                        to_bits(rng.standard_normal((b, n, s, d)), dtype)
                        for n, s in ((h, sq), (hk, sk), (hk, sk))
                    ]
                    dq, dk, dv = (cp.asarray(stored(x, major)) for x in host)
                    # NaN: all must be written
                    out = cp.full(stored_shape((b, h, sq, d), major), 0xFFFF, cp.uint16)
                    scale = 1.0 / math.sqrt(d)
                    grid, block, smem = geometry(b, h, sq, d)
                    args = launch_args(dq, dk, dv, out, h, hk, sq, sk, scale, causal, major)
                    functions[kernel_name(dtype, d)](grid, block, args, shared_mem=smem)
                    got = from_bits(stored(out.get(), major), dtype)
                    vq, vk, vv = (from_bits(x, dtype) for x in host)
                    ref = reference(vq, vk, vv, scale, causal)
                    bound = tolerance(dtype, sk, d) * float(np.max(np.abs(vv)))
                    err = np.abs(got - ref)
                    if not np.all(err <= bound):  # NaN fails too
                        worst = float(np.nanmax(err)) if np.isfinite(err).any() else math.nan
                        return (
                            f"{kernel_name(dtype, d)} on B{b} H{h}/{hk} Sq{sq} Sk{sk}"
                            f" causal={causal}{' seq-major' * major}: max error {worst:.3g} >"
                            f" {bound:.3g}"
                        )
    stream.synchronize()
    return None


SOURCE = r"""
// FlashAttention-2 forward on the tensor cores (see accelkit_cuda/flash_attention.py).
// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, D], out [B, H, Sq, D], contiguous, 16-bit
// storage (f16 or bf16 bits); with seq_major stored [B, Sq, H, D] and [B, Sk, Hkv, D] instead
// (rows H D or Hkv D apart), read and written in place; grid (ceil(Sq / BM), B * H), block 128, dynamic shared memory
// (BM + 4 BN) (D + PAD) 2 bytes. scale_log2 = scale * log2(e).
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;

#define BM 64
#define BN 64
#define NWARPS 4
#define PAD 8

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global -> shared, asynchronously; bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

struct F16 {};
struct BF16 {};
template <typename T> struct Mma;
template <> struct Mma<F16> {
    static __device__ __forceinline__ void run(float* c, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7},"
            " {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // Two floats rounded to nearest even, lo in the low half (the lower column index).
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct Mma<BF16> {
    static __device__ __forceinline__ void run(float* c, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7},"
            " {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

// rows [row0, row0 + ROWS) of a [nrows, D] matrix whose rows lie rs elements apart (a
// multiple of 8: 16-byte chunks stay aligned) into shared memory (row stride D + PAD); rows
// at or past nrows are zero-filled (their source address stays in bounds).
template <int ROWS, int D> __device__ __forceinline__ void load_tile(
        u16* dst, const u16* src, i64 row0, i64 nrows, i64 rs, int tid) {
    constexpr int CH = D / 8;  // 16-byte chunks per row
    #pragma unroll
    for (int c = tid; c < ROWS * CH; c += NWARPS * 32) {
        int r = c / CH, col = (c % CH) * 8;
        bool ok = row0 + r < nrows;
        const u16* s = src + (ok ? (row0 + r) * rs + col : 0);
        cp_async16(smem_u32(dst + r * (D + PAD) + col), s, ok ? 16 : 0);
    }
}

template <typename T, int D> __device__ __forceinline__ void fa2_impl(
        const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
        u16* __restrict__ out, int H, int Hkv, i64 Sq, i64 Sk, float scale_log2, int causal,
        int seq_major) {
    constexpr int LD = D + PAD;
    constexpr int KT = D / 16;   // k-steps of Q K^T
    constexpr int DT = D / 8;    // n-tiles of the output
    constexpr int NT = BN / 8;   // n-tiles of the scores
    extern __shared__ __align__(16) u16 smem[];
    u16* Qs = smem;                  // [BM][LD]
    u16* Ks = Qs + BM * LD;          // [2][BN][LD]
    u16* Vs = Ks + 2 * BN * LD;      // [2][BN][LD]
    const float NEG_INF = -__int_as_float(0x7f800000);

    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int g = lane >> 2, t = lane & 3;       // the mma fragments' row group and column pair
    int li = lane >> 3, lr = lane & 7;     // ldmatrix: which 8x8 matrix, which of its rows
    i64 m0 = (i64)(gridDim.x - 1 - blockIdx.x) * BM;  // the longest causal blocks first
    i64 bh = blockIdx.y, b = bh / H;
    int h = (int)(bh % H), hk = h / (H / Hkv);
    // A row's start and the stride between rows: D apart head-major, a token's heads apart
    // sequence-major.
    const i64 qrs = seq_major ? (i64)H * D : D, krs = seq_major ? (i64)Hkv * D : D;
    const i64 qoff = seq_major ? (b * Sq * H + h) * D : bh * Sq * D;
    const i64 koff = seq_major ? (b * Sk * Hkv + hk) * D : (b * Hkv + hk) * Sk * D;
    const u16* qb = q + qoff;
    const u16* kb = k + koff;
    const u16* vb = v + koff;
    u16* ob = out + qoff;
    i64 offset = Sk - Sq;  // causal: row i sees keys j <= i + offset

    i64 last = min(Sq - 1, m0 + BM - 1);
    i64 kend = causal ? min(Sk, last + offset + 1) : Sk;
    int ntiles = kend > 0 ? (int)((kend + BN - 1) / BN) : 0;
    i64 r0 = m0 + warp * 16 + g, r1 = r0 + 8;  // this thread's two rows
    if (ntiles == 0) {  // no row of the block sees a key: zeros
        #pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            int col = dt * 8 + 2 * t;
            if (r0 < Sq) *(u32*)(ob + r0 * qrs + col) = 0u;
            if (r1 < Sq) *(u32*)(ob + r1 * qrs + col) = 0u;
        }
        return;
    }

    load_tile<BM, D>(Qs, qb, m0, Sq, qrs, tid);
    load_tile<BN, D>(Ks, kb, 0, Sk, krs, tid);
    load_tile<BN, D>(Vs, vb, 0, Sk, krs, tid);
    cp_commit();

    u32 qf[KT][4];
    float o[DT][4];
    #pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};

    for (int j = 0; j < ntiles; ++j) {
        int buf = j & 1;
        if (j + 1 < ntiles) {  // the next tile, into the other buffer, while this one computes
            load_tile<BN, D>(Ks + (buf ^ 1) * BN * LD, kb, (i64)(j + 1) * BN, Sk, krs, tid);
            load_tile<BN, D>(Vs + (buf ^ 1) * BN * LD, vb, (i64)(j + 1) * BN, Sk, krs, tid);
        }
        cp_commit();   // (an empty group on the last tile: the wait below stays uniform)
        cp_wait<1>();  // everything but the newest group has landed: this tile (and Q)
        __syncthreads();
        if (j == 0) {
            #pragma unroll
            for (int kk = 0; kk < KT; ++kk)
                ldsm_x4(qf[kk], smem_u32(Qs + (warp * 16 + lr + 8 * (li & 1)) * LD
                                         + kk * 16 + 8 * (li >> 1)));
        }
        const u16* Kt = Ks + buf * BN * LD;
        const u16* Vt = Vs + buf * BN * LD;

        // S = Q K^T (f32)
        float s[NT][4];
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        #pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            #pragma unroll
            for (int nn = 0; nn < NT / 2; ++nn) {
                u32 r[4];
                ldsm_x4(r, smem_u32(Kt + (nn * 16 + lr + 8 * (li >> 1)) * LD + kk * 16
                                    + 8 * (li & 1)));
                Mma<T>::run(s[2 * nn], qf[kk], r[0], r[1]);
                Mma<T>::run(s[2 * nn + 1], qf[kk], r[2], r[3]);
            }
        }

        // scale (log2 domain), then mask: past the keys' end, and above the causal diagonal
        i64 n0 = (i64)j * BN;
        bool edge = n0 + BN > Sk || (causal && n0 + BN - 1 > m0 + offset);
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[nt][e] * scale_log2;
                if (edge) {
                    i64 key = n0 + nt * 8 + 2 * t + (e & 1);
                    i64 row = e < 2 ? r0 : r1;
                    if (key >= Sk || (causal && key > row + offset)) x = NEG_INF;
                }
                s[nt][e] = x;
            }
        }

        // online softmax: the rows' new maxima (over the four lanes of a row), the rescaling
        float mx[2] = {mrow[0], mrow[1]};
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
        float base[2], corr[2];
        #pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            base[i] = mx[i] == NEG_INF ? 0.f : mx[i];  // a row that sees nothing yet: p = 0
            corr[i] = exp2f(mrow[i] - base[i]);
            mrow[i] = mx[i];
            lrow[i] *= corr[i];
        }
        #pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[dt][0] *= corr[0]; o[dt][1] *= corr[0];
            o[dt][2] *= corr[1]; o[dt][3] *= corr[1];
        }
        // P = exp2(S - max): summed in f32 (this lane's part of the row), rounded to T as the
        // A fragments of P V (two adjacent score tiles make one m16k16 fragment).
        u32 pf[BN / 16][4];
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float p0 = exp2f(s[nt][0] - base[0]), p1 = exp2f(s[nt][1] - base[0]);
            float p2 = exp2f(s[nt][2] - base[1]), p3 = exp2f(s[nt][3] - base[1]);
            lrow[0] += p0 + p1;
            lrow[1] += p2 + p3;
            pf[nt >> 1][(nt & 1) * 2 + 0] = Mma<T>::pack(p0, p1);
            pf[nt >> 1][(nt & 1) * 2 + 1] = Mma<T>::pack(p2, p3);
        }

        // O += P V
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            #pragma unroll
            for (int dd = 0; dd < D / 16; ++dd) {
                u32 r[4];
                ldsm_x4_trans(r, smem_u32(Vt + (kk * 16 + lr + 8 * (li & 1)) * LD + dd * 16
                                          + 8 * (li >> 1)));
                Mma<T>::run(o[2 * dd], pf[kk], r[0], r[1]);
                Mma<T>::run(o[2 * dd + 1], pf[kk], r[2], r[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }

    // normalize and store: a row that saw no key (l == 0) is zero; a NaN sum stays NaN
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 1);
        lrow[i] += __shfl_xor_sync(0xffffffffu, lrow[i], 2);
    }
    float inv0 = lrow[0] == 0.f ? 0.f : 1.f / lrow[0];
    float inv1 = lrow[1] == 0.f ? 0.f : 1.f / lrow[1];
    #pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        int col = dt * 8 + 2 * t;
        if (r0 < Sq) *(u32*)(ob + r0 * qrs + col) = Mma<T>::pack(o[dt][0] * inv0, o[dt][1] * inv0);
        if (r1 < Sq) *(u32*)(ob + r1 * qrs + col) = Mma<T>::pack(o[dt][2] * inv1, o[dt][3] * inv1);
    }
}

#define FA2_ENTRY(T, S, D)                                                                       \
extern "C" __global__ void __launch_bounds__(NWARPS * 32) fa2_##S##_d##D(                      \
        const u16* q, const u16* k, const u16* v, u16* out, int H, int Hkv, i64 Sq, i64 Sk,     \
        float scale_log2, int causal, int seq_major)                                            \
    { fa2_impl<T, D>(q, k, v, out, H, Hkv, Sq, Sk, scale_log2, causal, seq_major); }

FA2_ENTRY(F16, f16, 64)
FA2_ENTRY(F16, f16, 128)
FA2_ENTRY(BF16, bf16, 64)
FA2_ENTRY(BF16, bf16, 128)
"""

if __name__ == "__main__":
    sys.exit(main(sys.argv))
