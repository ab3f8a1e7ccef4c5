"""Kernel variants chosen from what a device reports, verified before use.

Some kernels come in variants picked from the device's own report: the packed GEMM's register
block (its vector width follows ``CL_DEVICE_NATIVE_VECTOR_WIDTH_*``), the tiled GEMM's tile (from
the local memory size), the work-group size of row reductions and the query rows per work-group
of flash attention (from the maximum work-group size), and the f64 path (from ``cl_khr_fp64``).
A report is a claim, not a proof: PoCL 3.0 (LLVM 14) on a Zen 4 EPYC compiles for ``znver3``
but reports 16-wide float vectors and links its AVX-512 library, and its compiler then aborts
the whole process (``LLVM ERROR: Cannot select``), or never finishes, building a 16-wide block.
So:

- every *family* has candidates, best first, ending in a **portable** variant (narrow vectors,
  small work-groups, no extension) that builds everywhere; until a better candidate is verified
  the backend runs the portable one;
- verification builds each candidate and checks it against NumPy **in a child process**
  (:mod:`accelkit_opencl.verify`), so a compiler crash costs the child, not the user; it runs off
  the event loop, once per device, started on first need (a backend's first kernel) or by
  ``accelkit calibrate``, with progress in the ``accelkit.opencl`` logger (or a callback);
- verdicts (with the failure's reason and log) are stored in ``variants.json`` in the plugin's
  cache folder (:mod:`accelkit_opencl.caches`), keyed by platform, device, driver and plugin
  version, and reused: a failed candidate is never tried again for that device and driver;
- a family without a portable variant (``fp64``) waits for its verdict where it is first needed,
  off the loop (in the stream's submission thread), and a failed verdict refuses its dtype with a
  typed error.

``ACCELKIT_OPENCL_VERIFY=0`` turns verification off: every family runs its portable variant (the
f64 path is then trusted as reported).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.sdk import env_str
from accelkit_opencl.caches import cache_folder, plugin_version
from accelkit_opencl.opencl_linalg import GemmBlock

__all__ = [
    "FAMILIES",
    "Candidate",
    "VariantChoice",
    "Verifier",
    "candidates",
    "device_key",
    "verifier_for",
]

log = logging.getLogger("accelkit.opencl")

#: Seconds one candidate may take in the child (build and check) before it counts as hung.
CANDIDATE_TIMEOUT = 20.0


@dataclass(frozen=True)
class Candidate:
    """One variant of a family: ``label`` names it in verdicts, ``value`` is what the kernels
    use (a GemmBlock, a (tile, work-per-item) pair, a work-group size, or True)."""

    family: str
    label: str
    value: Any
    portable: bool = False

    @property
    def id(self) -> str:
        return f"{self.family}/{self.label}"


@dataclass(frozen=True)
class VariantChoice:
    """What a family runs now, and why (the route record of device-dependent kernels)."""

    family: str
    variant: str | None
    state: str  # "verified", "portable", "pending", "failed", "unverified"
    reason: str = ""


def _block_label(b: GemmBlock) -> str:
    return f"{b.rows}x{b.cols}v{b.width}k{b.k_unroll}wg{b.local[0]}x{b.local[1]}"


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def candidates(cl_device: Any, family: str) -> list[Candidate]:
    """The candidates of ``family`` for ``cl_device``, best first, the portable one last."""
    from accelkit_opencl.gemm_tuning import block_for, default_block

    if family.startswith("gemm_packed."):
        from accelkit_opencl.gemm_tuning import CANDIDATES

        dtype = DType(family.split(".", 1)[1])
        # A fixed set (the device's default block, the tuning candidates, a narrower block and
        # the portable one), so that a verifying child, which reads no tuning file, knows every
        # label; the stored tuning winner (one of them) goes first.
        if dtype is DType.F32:
            narrow, portable = GemmBlock(6, 16, 8, 4, (4, 4)), GemmBlock(4, 8, 4, 4, (4, 4))
        else:
            narrow, portable = GemmBlock(6, 8, 4, 4, (4, 4)), GemmBlock(4, 4, 2, 4, (4, 4))
        blocks = [block_for(cl_device, dtype), default_block(cl_device, dtype)]
        blocks += [*CANDIDATES[dtype], narrow]
        out: list[Candidate] = []
        for b in dict.fromkeys(blocks):
            if b != portable:
                out.append(Candidate(family, _block_label(b), b))
        return [*out, Candidate(family, _block_label(portable), portable, portable=True)]
    if family == "gemm_tiled":
        local = int(cl_device.local_mem_size)
        max_wg = int(cl_device.max_work_group_size)
        out = []
        for ts, wpt in ((32, 4), (16, 2)):
            if (ts // wpt) ** 2 <= max_wg and 2 * ts * (ts + 1) * 8 <= local:
                out.append(Candidate(family, f"t{ts}w{wpt}", (ts, wpt)))
        return [*out, Candidate(family, "t8w1", (8, 1), portable=True)]
    if family == "reduce_wg":
        device_wg = _pow2_floor(min(256, int(cl_device.max_work_group_size)))
        small = min(16, device_wg)
        out = [Candidate(family, f"wg{w}", w) for w in (device_wg, 64) if w > small]
        out = list(dict.fromkeys(out))
        return [*out, Candidate(family, f"wg{small}", small, portable=True)]
    if family == "attention_rows":
        best = min(32, _pow2_floor(int(cl_device.max_work_group_size)))
        small = min(8, best)
        out = [Candidate(family, f"bq{best}", best)] if best > small else []
        return [*out, Candidate(family, f"bq{small}", small, portable=True)]
    if family == "fp64":
        return [Candidate(family, "cl_khr_fp64", True)]
    raise KeyError(family)


def _tuned_label(cl_device: Any, family: str) -> str | None:
    """The label of the block ``gemm_tuning`` stored for ``family`` (None for other families)."""
    if not family.startswith("gemm_packed."):
        return None
    from accelkit_opencl.gemm_tuning import block_for

    return _block_label(block_for(cl_device, DType(family.split(".", 1)[1])))


def families(cl_device: Any) -> list[str]:
    """The families that apply to ``cl_device``."""
    fp64 = "cl_khr_fp64" in str(cl_device.extensions)
    out = ["gemm_packed.f32", "gemm_tiled", "reduce_wg", "attention_rows"]
    if fp64:
        out[1:1] = ["gemm_packed.f64"]
        out.append("fp64")
    return out


FAMILIES = (
    "gemm_packed.f32", "gemm_packed.f64", "gemm_tiled", "reduce_wg", "attention_rows", "fp64",
)  # fmt: skip


def device_key(cl_device: Any) -> str:
    """The hardware, driver and plugin a verdict holds for."""
    parts = (
        cl_device.platform.name,
        cl_device.platform.version,
        cl_device.name,
        cl_device.driver_version,
        cl_device.version,
        f"accelkit-opencl {plugin_version()}",
    )
    return " | ".join(str(p).strip() for p in parts)


# -- the verdict store -----------------------------------------------------------------------------
_FORMAT = "accelkit-opencl-variants"


def store_path() -> Path:
    """``$ACCELKIT_OPENCL_VARIANTS_FILE``, else ``variants.json`` in the cache folder."""
    override = env_str("ACCELKIT_OPENCL_VARIANTS_FILE")
    return Path(override) if override else cache_folder() / "variants.json"


def _read_store(path: Path) -> dict[str, Any]:
    """The stored verdicts; a missing, corrupt or foreign file reads as empty (and is rewritten
    whole on the next verdict)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _FORMAT or data.get("version") != 1:
            raise ValueError("foreign file")
        devices = data["devices"]
        if not isinstance(devices, dict):
            raise ValueError("no devices")
        return devices
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return {}  # (RecursionError: nested deeper than json parses)


def _write_store(path: Path, devices: dict[str, Any]) -> None:
    payload = json.dumps({"format": _FORMAT, "version": 1, "devices": devices}, indent=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".variants-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("accelkit-opencl: cannot store variant verdicts in %s: %s", path, exc)


# -- the verifier ----------------------------------------------------------------------------------
Progress = Callable[[str], None]


class Verifier:
    """Verdicts for one device (shared by every backend of the process on that device)."""

    def __init__(self, cl_device: Any, index: int) -> None:
        self.cl_device = cl_device
        self.index = index
        self.key = device_key(cl_device)
        self.path = store_path()
        self.families = families(cl_device)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._run_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: Set when a verification run itself failed: this process does not start another
        #: (the portable variants run); a later process tries again.
        self._gave_up = False
        #: family -> {"chosen": label | None, "results": {label: {"ok", "reason", "log"}}}
        self._verdicts: dict[str, dict[str, Any]] = {}
        self._load()

    @staticmethod
    def enabled() -> bool:
        return env_str("ACCELKIT_OPENCL_VERIFY") not in ("0", "false", "no", "off")

    def _load(self) -> None:
        entry = _read_store(self.path).get(self.key)
        if not isinstance(entry, dict):
            return
        for fam in self.families:
            v = entry.get(fam)
            if isinstance(v, dict) and isinstance(v.get("results"), dict):
                # A transient failure (a child that could not start, a timeout on a busy
                # machine) is tried again in a later process; if one is dropped, so is the
                # family's completion.
                results = {
                    label: r
                    for label, r in v["results"].items()
                    if isinstance(r, dict) and not r.get("transient")
                }
                complete = bool(v.get("complete")) and len(results) == len(v["results"])
                self._verdicts[fam] = {
                    "chosen": v.get("chosen") if complete else None,
                    "results": results,
                    **({"complete": True} if complete else {}),
                }
        if not self.pending():
            self._done.set()

    def _record(
        self,
        fam: str,
        label: str,
        ok: bool,
        reason: str = "",
        log_text: str = "",
        transient: bool = False,
    ) -> None:
        """Note one candidate's verdict, and store it at once (a process that ends before
        verification does keeps what it learnt)."""
        with self._lock:
            v = self._verdicts.setdefault(fam, {"chosen": None, "results": {}})
            result = {"ok": ok, "reason": reason, "log": log_text[-8000:]}
            if transient:
                result["transient"] = True
            v["results"][label] = result
        self._save()

    def _finish_family(self, fam: str) -> None:
        cands = candidates(self.cl_device, fam)
        with self._lock:
            v = self._verdicts.setdefault(fam, {"chosen": None, "results": {}})
            v["chosen"] = next(
                (c.label for c in cands if v["results"].get(c.label, {}).get("ok")), None
            )
            v["complete"] = True

    def _save(self) -> None:
        with self._lock:
            devices = _read_store(self.path)
            devices[self.key] = {f: dict(v) for f, v in self._verdicts.items()}
        _write_store(self.path, devices)

    # -- what the kernels use -------------------------------------------------------------------
    def _complete(self, fam: str) -> dict[str, Any] | None:
        v = self._verdicts.get(fam)
        return v if v is not None and v.get("complete") else None

    def choice(self, fam: str) -> tuple[Candidate, VariantChoice]:
        """The candidate ``fam`` runs now: the verified best, else the portable one."""
        cands = candidates(self.cl_device, fam)
        portable = cands[-1]
        if not self.enabled():
            return portable, VariantChoice(fam, portable.label, "portable", "verification is off")
        with self._lock:
            v = self._complete(fam)
            if v is None:
                return portable, VariantChoice(
                    fam, portable.label, "pending", "verification has not finished"
                )
            results = v["results"]
            # The best candidate that passed, in today's order (a stored tuning winner first,
            # the portable block too when it won).
            order = sorted(cands, key=lambda c: c.label != _tuned_label(self.cl_device, fam))
            chosen = next((c.label for c in order if results.get(c.label, {}).get("ok")), None)
            failed = [
                f"{label}: {r.get('reason')}" for label, r in v["results"].items() if not r["ok"]
            ]
        for c in cands:
            if c.label == chosen:
                return c, VariantChoice(fam, c.label, "verified", "; ".join(failed))
        return portable, VariantChoice(
            fam,
            None if portable.family == "fp64" else portable.label,
            "failed",
            "; ".join(failed) or "no candidate passed",
        )

    def wait(self, fam: str, timeout: float | None = None) -> None:
        """Block (never on the event loop: callers are submission threads) until ``fam`` has a
        verdict, starting verification if needed; returns early when verification ends without
        one (the caller then runs the portable variant)."""
        if not self.enabled():
            return
        thread = self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._complete(fam) is None and thread is not None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            thread.join(0.05 if left is None else min(0.05, left))
            if not thread.is_alive():
                return

    def pending(self) -> list[str]:
        return [f for f in self.families if self._complete(f) is None]

    def passed(self, fam: str) -> list[Candidate]:
        """The candidates of ``fam`` verified on this device, best first."""
        with self._lock:
            results = dict(self._verdicts.get(fam, {}).get("results", {}))
        return [c for c in candidates(self.cl_device, fam) if results.get(c.label, {}).get("ok")]

    # -- running it -----------------------------------------------------------------------------
    def start(self, progress: Progress | None = None) -> threading.Thread | None:
        """Verify the families without a verdict in a background thread (one at a time); the
        running thread, or None when there is nothing to verify."""
        if not self.enabled():
            return None
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self._thread
            if self._done.is_set() or self._gave_up or not self.pending():
                return None
            self._thread = threading.Thread(
                target=self.run,
                kwargs={"progress": progress},
                name=f"accelkit-opencl-verify-{self.index}",
                daemon=True,
            )
            self._thread.start()
            return self._thread

    def run(
        self,
        progress: Progress | None = None,
        families: Sequence[str] | None = None,
        exhaustive: bool = False,
    ) -> None:
        """Verify every family without a verdict (or those of ``families``), in child processes
        (blocking; see :meth:`start`). A family's verification stops at its first (best)
        candidate that passes, unless ``exhaustive`` (GEMM tuning: every candidate it may
        time must be verified)."""
        say = progress or (lambda msg: log.info("%s", msg))
        with self._run_lock:
            self._run(say, families, exhaustive)

    def _run(self, say: Progress, families: Sequence[str] | None, exhaustive: bool) -> None:
        try:
            todo: list[Candidate] = []
            wanted = self.families if exhaustive else self.pending()
            for fam in wanted:
                if families is not None and fam not in families:
                    continue
                done = self._verdicts.get(fam, {}).get("results", {})
                if not exhaustive and any(r.get("ok") for r in done.values()):
                    continue  # a passing candidate from an unfinished run: no need for more
                todo += [c for c in candidates(self.cl_device, fam) if c.label not in done]
            started = time.monotonic()
            if todo:
                say(
                    f"opencl:{self.index}: verifying {len(todo)} kernel variants of"
                    f" {self.cl_device.name.strip()} in a child process"
                )
            remaining = list(todo)
            while remaining:
                remaining = self._run_child(remaining, say, exhaustive)
            for fam in self.pending():
                if families is None or fam in families:
                    self._finish_family(fam)
            self._save()
            if todo:
                say(
                    f"opencl:{self.index}: verification done in {time.monotonic() - started:.1f} s"
                    f" ({self.summary()})"
                )
        except Exception as exc:  # never take the user's process down; portable variants stay
            self._gave_up = True
            log.warning("accelkit-opencl: kernel variant verification failed: %r", exc)
        finally:
            if not self.pending():
                self._done.set()

    def summary(self) -> str:
        parts = []
        for fam in self.families:
            _, ch = self.choice(fam)
            parts.append(f"{fam}={ch.variant} ({ch.state})")
        return ", ".join(parts)

    def _run_child(
        self, todo: list[Candidate], say: Progress, exhaustive: bool = False
    ) -> list[Candidate]:
        """Run one child over ``todo``; return what is left when it died (the candidate it died
        on is recorded as failed)."""
        import subprocess

        job = {
            "device": self.index,
            "candidates": [[c.family, c.label] for c in todo],
            "exhaustive": exhaustive,
        }
        env = dict(os.environ)
        env["ACCELKIT_OPENCL_VERIFY"] = "0"  # the child verifies nothing of its own
        # The child's compiler output stays out of the user's caches: a crash may leave entries.
        scratch = tempfile.mkdtemp(prefix="accelkit-opencl-verify-")
        env["POCL_CACHE_DIR"] = os.path.join(scratch, "pocl")
        env["ACCELKIT_OPENCL_CACHE"] = os.path.join(scratch, "programs")
        env["ACCELKIT_OPENCL_PROGRAM_CACHE"] = "0"
        env["PYTHONFAULTHANDLER"] = "1"
        job["parent"] = os.getpid()
        proc = subprocess.Popen(
            [sys.executable, "-m", "accelkit_opencl.verify", json.dumps(job)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        _children.add(proc)
        stderr_lines: list[str] = []
        timed_out = threading.Event()

        def on_timeout() -> None:
            timed_out.set()
            with contextlib.suppress(OSError):
                proc.kill()

        def on_timeout_quiet() -> None:
            with contextlib.suppress(OSError):
                proc.kill()

        def read_stderr() -> None:
            for line in proc.stderr or ():
                stderr_lines.append(line)
                # LLVM's fatal errors end the process, but from a compiler thread that can
                # leave it hanging in its exit handlers: give it a moment, then end it.
                if line.startswith("LLVM ERROR"):
                    killer = threading.Timer(3.0, on_timeout_quiet)
                    killer.daemon = True
                    killer.start()

        err_reader = threading.Thread(target=read_stderr, daemon=True)
        err_reader.start()
        by_id = {c.id: c for c in todo}
        left = list(todo)
        current: Candidate | None = None
        timer: threading.Timer | None = None

        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "start" in msg:
                    current = by_id.get(msg["start"])
                    if timer is not None:
                        timer.cancel()
                    timer = threading.Timer(CANDIDATE_TIMEOUT, on_timeout)
                    timer.daemon = True
                    timer.start()
                    if current is not None:
                        n = len(todo) - len(left) + 1
                        say(f"opencl:{self.index}: [{n}/{len(todo)}] {current.id}")
                elif "skip" in msg and msg["skip"] in by_id:
                    left.remove(by_id[msg["skip"]])
                elif "done" in msg and msg["done"] in by_id:
                    c = by_id[msg["done"]]
                    ok = bool(msg.get("ok"))
                    self._record(
                        c.family, c.label, ok, str(msg.get("reason", "")), str(msg.get("log", ""))
                    )
                    verdict = "ok" if ok else f"failed: {msg.get('reason')}"
                    say(f"opencl:{self.index}: {c.id} {verdict} ({msg.get('seconds', '?')} s)")
                    left.remove(c)
                    current = None
            proc.wait()
        finally:
            _children.discard(proc)
            if timer is not None:
                timer.cancel()
            err_reader.join(5)
            with contextlib.suppress(OSError):
                import shutil

                shutil.rmtree(scratch, ignore_errors=True)
        if current is not None and current in left:
            tail = "".join(stderr_lines)[-8000:]
            if timed_out.is_set():
                reason = f"timed out after {CANDIDATE_TIMEOUT:.0f} s"
            else:
                reason = _death(proc.returncode, tail)
            # A crash or a hang (PoCL's LLVM 14 aborts on 16-wide fma on some AMD hosts, and
            # loops without end on others) is final for this device and driver.
            self._record(current.family, current.label, False, reason, tail)
            say(f"opencl:{self.index}: {current.id} failed: {reason}")
            left.remove(current)
            for c in _same_or_wider(current, left):
                why = f"not tried: {current.label} of the same vector width failed ({reason})"
                self._record(c.family, c.label, False, why[:500])
                say(f"opencl:{self.index}: {c.id} skipped: {current.label} failed")
                left.remove(c)
            if exhaustive:
                return left
            passed = {
                fam
                for fam, v in self._verdicts.items()
                if any(r["ok"] for r in v["results"].values())
            }
            return [c for c in left if c.family not in passed]
        if left:
            # The child died before starting them (it could not import or open the device):
            # they fail alike in this process, and are tried again by a later one.
            tail = "".join(stderr_lines)[-8000:]
            reason = _death(proc.returncode, tail)
            for c in left:
                self._record(c.family, c.label, False, reason, tail, transient=True)
        return []


def _same_or_wider(failed: Candidate, rest: Sequence[Candidate]) -> list[Candidate]:
    """The GEMM blocks of ``failed``'s family in ``rest`` with vectors at least as wide: the
    compilers seen failing (a crash, or a build that never ends) fail on the vector type, so
    these are recorded as failed without a build, each at a timeout's cost saved."""
    if not isinstance(failed.value, GemmBlock):
        return []
    width = failed.value.width
    return [
        c
        for c in rest
        if c.family == failed.family and isinstance(c.value, GemmBlock) and c.value.width >= width
    ]


#: Verifying children running now: ended when this process exits, so that none outlives it
#: (a child stuck in a compiler would run on, and a daemon thread's wait ends with the process).
_children: set[Any] = set()


@atexit.register
def _end_children() -> None:
    for proc in list(_children):
        with contextlib.suppress(OSError):
            proc.kill()


def _death(code: int | None, stderr: str) -> str:
    import signal

    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    meaningful = next(
        (ln for ln in lines if "ERROR" in ln or "Error" in ln or "error:" in ln),
        lines[-1] if lines else "",
    )
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = f"the compiler crashed the process ({name})"
    else:
        what = f"the child exited with status {code}"
    return f"{what}: {meaningful}"[:500] if meaningful else what


_verifiers: dict[tuple[str, str], Verifier] = {}
_verifiers_lock = threading.Lock()


def verifier_for(cl_device: Any, index: int) -> Verifier:
    """The process's verifier of ``cl_device`` (one per device and store file)."""
    key = (device_key(cl_device), str(store_path()))
    with _verifiers_lock:
        v = _verifiers.get(key)
        if v is None:
            v = _verifiers[key] = Verifier(cl_device, index)
        return v


def forget_verifiers() -> None:
    """Drop the process's verifiers (tests; a changed store is read again)."""
    with _verifiers_lock:
        _verifiers.clear()


def overrides_from_env() -> dict[str, str]:
    """``ACCELKIT_OPENCL_VARIANTS`` (JSON ``{family: label}``): force variants (the verifying
    child uses it; so can a user pinning a known-good variant)."""
    raw = env_str("ACCELKIT_OPENCL_VARIANTS")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        return {str(k): str(v) for k, v in dict(data).items()}
    except (ValueError, TypeError, RecursionError):
        return {}


def pick(
    verifier: Verifier, cl_device: Any, fam: str, forced: dict[str, str]
) -> tuple[Candidate, VariantChoice]:
    """The candidate to run for ``fam``: a forced one, else the verifier's choice."""
    label = forced.get(fam)
    if label is not None:
        for c in candidates(cl_device, fam):
            if c.label == label:
                return c, VariantChoice(fam, c.label, "forced", "ACCELKIT_OPENCL_VARIANTS")
        known = ", ".join(c.label for c in candidates(cl_device, fam))
        raise InvalidArgumentError(
            f"no variant {label!r} of {fam} on this device (it has: {known})"
        )
    return verifier.choice(fam)


def describe(choices: Sequence[VariantChoice]) -> list[dict[str, Any]]:
    return [vars(c) for c in choices]
