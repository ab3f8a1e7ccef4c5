"""Test sessions: ``nox`` runs tests, lint, typecheck and the docs build; ``nox -s bench`` the
benchmarks; ``nox -s docs`` builds the docs site into site/.

Sessions use the interpreter that runs nox (CI has exactly one), through uv when it is installed
(about four times faster than pip here) and pip otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nox

os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
# MkDocs and Material print a banner about MkDocs 2.0 on every build; it says nothing of this one
os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
nox.options.default_venv_backend = "uv" if shutil.which("uv") else "virtualenv"
# ``nox``: the tests session, which runs lint, typecheck and docs as parts of its own, beside the
# tests
nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
ROOT = Path(__file__).resolve().parent


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The core test suite, the conformance suite on every installed backend (the CPU backend,
    the OpenCL backend on PoCL's CPU device, the WebGPU backend on Mesa's llvmpipe, the CUDA
    backend where a GPU is present), and each
    device plugin's own tests (the CUDA plugin's GPU-free ones everywhere: the probe, the
    capabilities, NVRTC compilation; its GPU tests skip with the reason elsewhere).

    The suite runs in parts, each its own ``python -X faulthandler -m pytest`` process, so that a
    driver that aborts the process (a compiler's fatal error) takes down only its part: ``core``
    (``tests/`` but the tests parametrized by backend), ``conformance[<backend>]`` for each
    installed backend (the conformance suite and the other tests parametrized by backend, run
    with ``ACCELKIT_TEST_BACKEND=<backend>``; a backend without a device here is listed, not
    run), and ``plugin <distribution>`` for each device plugin's ``tests/``. Each part's output
    is shown as it comes; at the end, a table gives every part's outcome (passed, failed,
    ``crashed: SIGABRT`` with the test that was running, timed out, no tests), its counts and
    time, and the last line, alone, is ``N passed, N failed, N skipped`` (CI reads it). The
    session fails if any part failed, crashed or collected no test. (tests/support/parts.py.)

    Arguments after ``--`` go to pytest: options only (``nox -s tests -- -k softmax -x``) go to
    every part, and a part they leave without a test shows as ``no tests`` without failing the
    session (unless no part runs a test); arguments that name tests (``nox -s tests --
    tests/test_cli.py -k doctor``) run exactly that, as one pytest process, as ``pytest`` would.
    """
    session.install(
        "-e",
        # [docs]: the docs build runs as a part (static_parts)
        ".[test,jit,docs]",
        "-e",
        "./plugins/accelkit-opencl[pocl]",
        "-e",
        # CuPy without the CUDA toolkit wheels (gigabytes): no GPU here; [cuda12] is for users
        "./plugins/accelkit-cuda[cuda12-sysctk]",
        # WebGPU: wgpu-py finds Mesa's llvmpipe through OpenGL on a machine without a GPU
        "-e",
        "./plugins/accelkit-webgpu",
        # Dask: its conformance part runs on a local cluster of two worker processes
        "-e",
        "./plugins/accelkit-dask",
        # the example backend (docs/plugins.md), written only against accelkit.sdk: the
        # conformance suite runs against it as against every installed backend
        "./tests/plugins/accelkit-example",
        # small plugin distributions made for the registry, selector, fallback and doctor tests
        "./tests/plugins/accelkit-testplug-good",
        "./tests/plugins/accelkit-testplug-broken",
        "./tests/plugins/accelkit-testplug-future",
        "./tests/plugins/accelkit-testplug-badprobe",
        "./tests/plugins/accelkit-testplug-subset",
        "./tests/plugins/accelkit-testplug-crash",
        # lint and typecheck run as parts beside the tests (static_parts), as does the docs build
        *STATIC_TOOLS,
    )
    # The CPU backend's JIT kernels compile on first use rather than in the background, so that
    # every float32 call the suite makes after the first goes through them.
    session.env.setdefault("ACCELKIT_CPU_JIT", "eager")
    parts = _load_parts()
    env = _session_env(session)
    python = os.path.join(session.bin, "python")
    posargs = list(session.posargs)
    if _names_tests(posargs):
        plan = [parts.Part("pytest " + " ".join(posargs), tuple(posargs))]
        extra_args: list[str] = []
        empty_ok = False
    else:
        plan = _test_parts(parts, python, env)
        if not posargs:  # a run narrowed by -k and friends is about tests, not lint
            plan += static_parts(parts, session.bin)
        plan = _schedule(plan)
        extra_args, empty_ok = posargs, bool(posargs)
    start = time.monotonic()
    with _shared_caches(env), _dask_cluster(python, env, plan):
        results = _run(parts, plan, python, env, session, "test-parts", extra_args, empty_ok)
    wall = time.monotonic() - start
    print("\n" + parts.format_summary(results), flush=True)
    print(
        f"(wall time {wall:.0f} s, {_jobs()} part(s) at a time; the budget of the whole run,"
        f" install included, is {BUDGET_S / 60:.0f} minutes on a 2-core machine)",
        flush=True,
    )
    failures = parts.session_failures(results, empty_ok=empty_ok)
    if failures:
        session.error("; ".join(failures))


#: The whole CI run's time budget (``.ci/run``: install, every part, lint and typecheck) on a
#: 2-core machine; CI itself stops at 90 minutes. Each part has a share of it (:data:`SHARES`):
#: the summary names a part that took longer than its share (a warning: machines are noisy).
BUDGET_S = 45 * 60
#: Each part's share of :data:`BUDGET_S`, in seconds of wall time on a 2-core machine with two
#: parts at a time (CONTRIBUTING.md, "Where the time goes"), with room for a noisy machine; also
#: the order the parts start in (largest first). A part not named here has no share.
SHARES: dict[str, float] = {
    # measured 2026-11-26 (AMD EPYC, 2 vCPUs; the whole .ci/run 36 minutes): 925, 958, 1400,
    # 544, 472, 285, 254, 191, 28, 60, 70, 17, 22 and 1 s, in this order. Equal shares keep the
    # plan's order (core, then the OpenCL shards), as measured.
    "conformance[dask]": 1500,
    "core": 1500,
    "conformance[opencl] 1/2": 1500,
    "conformance[opencl] 2/2": 1500,
    "plugin accelkit-opencl": 700,
    "conformance[webgpu] 1/2": 450,
    "conformance[webgpu] 2/2": 450,
    "plugin accelkit-dask": 300,
    "typecheck": 120,
    "conformance[cpu]": 120,
    # 441 s in a whole `.ci/run` on 2 cores (2026-11-27; 578 s on a loaded dev VM). A worker
    # process per backend, reused from test to test (ACCELKIT_ISOLATE_SPARE)
    "conformance[isolated:cpu]": 450,
    # a subset (ISOLATED_OPENCL_TESTS): 110 s alone on a loaded dev VM (2026-11-27)
    "conformance[isolated:opencl]": 300,
    "conformance[example]": 120,
    "plugin accelkit-webgpu": 90,
    # 170 s in a whole `.ci/run` on 2 cores (2026-11-27, two parts at a time): the NVRTC
    # compile checks (the split-KV kernel's 24 variants, the permute kernels, built for the
    # host too) and the block diagnosis over the stand-in; 211 s on 2026-11-27 (stop 38),
    # then the f32 tiled attention kernel's text run on the host (about 40 s more)
    "plugin accelkit-cuda": 300,
    "lint": 60,
    # measured 2026-11-26 alone on a 2-core machine: 14 s (mkdocs build --strict 13 s, the check 1 s)
    "docs": 60,
}


def _jobs() -> int:
    """How many parts run at a time: ``ACCELKIT_TEST_JOBS``, else the machine's cores (at most
    4: each part is a process of a few hundred MB, and most parts use one core)."""
    wanted = os.environ.get("ACCELKIT_TEST_JOBS", "").strip()
    if wanted:
        return max(1, int(wanted))
    return max(1, min(4, os.cpu_count() or 1))


def _schedule(plan: list[Any]) -> list[Any]:
    """The plan with each part's share, the parts that run alongside first, then the longest
    first (by share), so that the last part to start is a short one."""
    shared = [dataclasses.replace(p, budget=SHARES.get(p.name, p.budget)) for p in plan]
    return sorted(shared, key=lambda p: (not p.alongside, -(p.budget or 0.0)))


def _run(
    parts: Any,
    plan: list[Any],
    python: str,
    env: dict[str, str],
    session: nox.Session,
    logs: str,
    extra_args: list[str],
    empty_ok: bool,
) -> list[Any]:
    return parts.run_parts(  # type: ignore[no-any-return]
        plan,
        python=python,
        cwd=ROOT,
        env=env,
        log_dir=Path(session.virtualenv.location) / "tmp" / logs,
        extra_args=extra_args,
        empty_ok=empty_ok,
        # A part that hangs ends as "timed out" (naming the test that was running) instead of
        # holding the session until CI's own limit.
        timeout=float(os.environ.get("ACCELKIT_PART_TIMEOUT_S", PART_TIMEOUT_S)),
        jobs=_jobs(),
    )


@contextlib.contextmanager
def _shared_caches(env: dict[str, str]) -> Iterator[None]:
    """One folder of device program caches (PoCL, PyOpenCL, accelkit's OpenCL, CUDA and WebGPU
    program caches) for every part of the run, removed at the end: a kernel compiled by one part
    is loaded by the others (``ACCELKIT_TEST_CACHES``, read by
    ``accelkit.testing.plugin.isolate_compiler_caches``). A folder already named is kept."""
    if env.get("ACCELKIT_TEST_CACHES"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="accelkit-test-caches-")
    env["ACCELKIT_TEST_CACHES"] = folder
    try:
        yield
    finally:
        env.pop("ACCELKIT_TEST_CACHES", None)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _dask_cluster(python: str, env: dict[str, str], plan: list[Any]) -> Iterator[None]:
    """For a part that tests the Dask backend: one local cluster of two worker processes
    (``python -m accelkit_dask.serve``) that its thousands of tests share, named to them by
    ``ACCELKIT_DASK_SCHEDULER``, and stopped at the end."""
    wanted = [p for p in plan if p.env.get("ACCELKIT_TEST_BACKEND") == "dask" and not p.skip_reason]
    if not wanted or env.get("ACCELKIT_DASK_SCHEDULER"):
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="accelkit-dask-"))
    address_file = folder / "address"
    # The cluster's own log (the workers log every task that raised, and the conformance suite
    # raises thousands on purpose) goes to a file, not between the parts' output.
    log_path = folder / "cluster.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [python, "-m", "accelkit_dask.serve", "--workers", "2", "--address-file",
         str(address_file), "--until-stdin-closes"],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not address_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(
                    f"python -m accelkit_dask.serve did not start a cluster; its log ends:\n{tail}"
                )
            time.sleep(0.1)
        address = address_file.read_text().strip()
        print(f"a local Dask cluster of two worker processes at {address} (log: {log_path})",
              flush=True)  # fmt: skip
        for part in wanted:
            part.env["ACCELKIT_DASK_SCHEDULER"] = address
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


#: Seconds one part may run (``ACCELKIT_PART_TIMEOUT_S`` overrides): a hang ends as "timed out"
#: rather than at CI's own limit. The longest, a shard of the OpenCL conformance part (its kernels
#: compile on the CPU, beside other parts), takes 15-20 minutes on a loaded 2-core machine.
PART_TIMEOUT_S = 2700.0
#: Seconds the Dask conformance part may run: alongside the other parts, it shares the cores
#: with them (about 17 minutes alone, 30 beside the OpenCL part on a 2-core machine).
DASK_PART_TIMEOUT_S = 3600.0
#: Backends whose conformance part is split in shards that run side by side (each shard every
#: N-th test), where parts run more than one at a time: the two longest, whose kernels compile
#: on the CPU (PoCL) or run on a software adapter (llvmpipe), so that neither is left alone at the
#: end of the run on one core.
SHARDS = {"opencl": 2, "webgpu": 2}
#: The conformance modules run on the isolated form of OpenCL (``ACCELKIT_TEST_ISOLATE=1``):
#: what crosses the worker's pipe in every way (lifecycle, streams and events, memory and
#: transfers, concurrency and cancellation), without the op modules, which compile one PoCL
#: kernel after another and are the same code below the pipe as in conformance[opencl].
ISOLATED_OPENCL_TESTS = (
    "src/accelkit/testing/test_backend.py",
    "src/accelkit/testing/test_factory.py",
    "src/accelkit/testing/test_stress.py",
)
#: The device plugins the tests session installs, whose tests/ it runs as parts of their own.
DEVICE_PLUGINS = ("accelkit-opencl", "accelkit-cuda", "accelkit-webgpu", "accelkit-dask")
#: pytest options that take a value (so that the value is not taken for a test path).
_VALUE_OPTIONS = {"-k", "-m", "-p", "-o", "-c", "-W", "-r", "--basetemp", "--rootdir", "--tb"}


def _load_parts() -> Any:
    """tests/support/parts.py, by path: nox runs outside the session's environment, and that
    module needs nothing but the standard library."""
    path = ROOT / "tests" / "support" / "parts.py"
    spec = importlib.util.spec_from_file_location("accelkit_test_parts", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _session_env(session: nox.Session) -> dict[str, str]:
    """What ``session.run`` would give a command: the session's environment, its bin first."""
    env = {**os.environ, **{k: v for k, v in session.env.items() if v is not None}}
    env["PATH"] = os.pathsep.join([session.bin, env.get("PATH", "")])
    env["VIRTUAL_ENV"] = session.virtualenv.location
    env.pop("PYTHONHOME", None)
    return env


def _names_tests(args: list[str]) -> bool:
    """Whether pytest arguments name tests (a file, a folder, a node id) rather than only
    filter them."""
    previous = ""
    for arg in args:
        takes_value, previous = previous in _VALUE_OPTIONS, arg
        if arg.startswith("-") or takes_value:
            continue
        if (ROOT / arg.split("::")[0]).exists():
            return True
    return False


_LIST_BACKENDS = (
    "import json;"
    " from accelkit.testing.backends import BACKEND_FIXTURES, PER_BACKEND_TESTS, installed_backends;"
    " print('ACCELKIT-BACKENDS ' + json.dumps({'backends': installed_backends(),"
    " 'paths': PER_BACKEND_TESTS, 'fixtures': BACKEND_FIXTURES}))"
)


def _test_parts(parts: Any, python: str, env: dict[str, str]) -> list[Any]:
    """core, conformance[<backend>] per installed backend, plugin <dist> per device plugin."""
    listing = subprocess.run(
        [python, "-X", "faulthandler", "-c", _LIST_BACKENDS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    found = [
        line.removeprefix("ACCELKIT-BACKENDS ")
        for line in listing.stdout.splitlines()
        if line.startswith("ACCELKIT-BACKENDS ")
    ]
    if listing.returncode != 0 or not found:
        # Listing the backends failed (a probe that crashes, say): the tests of every backend in
        # one part, which then fails with the reason in its own output.
        print(f"listing the backends failed (exit status {listing.returncode}):", flush=True)
        print(listing.stdout + listing.stderr, flush=True)
        plan = [parts.Part("core", ("tests",))]
    else:
        listed = json.loads(found[-1])
        paths, fixtures = tuple(listed["paths"]), listed["fixtures"]
        # Every test runs once: the per-backend ones in their backend's part, the rest in core.
        plan = [parts.Part("core", ("tests",), env=parts.split(paths, fixtures, "other"))]
        for backend in listed["backends"]:
            name = backend["name"]
            count = SHARDS.get(name, 1) if _jobs() > 1 else 1
            for index in range(1, count + 1):
                part = parts.Part(
                    f"conformance[{name}]" + (f" {index}/{count}" if count > 1 else ""),
                    paths,
                    env={
                        "ACCELKIT_TEST_BACKEND": name,
                        **parts.split(paths, fixtures, "backend"),
                        **(parts.shard(index, count) if count > 1 else {}),
                    },
                    skip_reason="" if backend["devices"] else f"no device: {backend['reason']}",
                    # Dask's tests mostly wait on the cluster's scheduler: they run first,
                    # alongside the others, on a local cluster they share (_dask_cluster), and
                    # may take as long as the others together
                    alongside=name == "dask",
                    timeout=DASK_PART_TIMEOUT_S if name == "dask" else None,
                )
                plan.insert(0, part) if part.alongside else plan.append(part)
            if name == "opencl":  # isolated too, on a subset (the whole suite takes ~30 min)
                plan.append(
                    parts.Part(
                        "conformance[isolated:opencl]",
                        ISOLATED_OPENCL_TESTS,
                        env={
                            "ACCELKIT_TEST_BACKEND": name,
                            "ACCELKIT_TEST_ISOLATE": "1",
                            **parts.split(ISOLATED_OPENCL_TESTS, fixtures, "backend"),
                        },
                        skip_reason="" if backend["devices"] else f"no device: {backend['reason']}",
                    )
                )
            if name == "cpu":  # the CPU backend again, isolated: in a worker process
                plan.append(
                    parts.Part(
                        "conformance[isolated:cpu]",
                        paths,
                        env={
                            "ACCELKIT_TEST_BACKEND": name,
                            "ACCELKIT_TEST_ISOLATE": "1",
                            **parts.split(paths, fixtures, "backend"),
                        },
                    )
                )
    for dist in DEVICE_PLUGINS:
        plan.append(parts.Part(f"plugin {dist}", (f"plugins/{dist}/tests",)))
    return plan


#: What lint and typecheck install (the tests session installs them too).
STATIC_TOOLS = ("ruff>=0.6", "mypy>=1.10")
#: The folders ruff checks and formats.
LINTED = (
    "src", "tests", "benchmarks", "plugins", "noxfile.py", "tools/docs_check.py",
    "tools/docs_roles.py",
)  # fmt: skip
#: What mypy --strict checks: the core, the device plugins and the tests (tests/ holds the example
#: backend, tests/plugins/accelkit-example/src/accelkit_example: naming it too would make mypy
#: see the module twice, and the other test plugins).
TYPECHECKED = (
    "src/accelkit", "plugins/accelkit-opencl/src/accelkit_opencl",
    "plugins/accelkit-cuda/src/accelkit_cuda", "plugins/accelkit-webgpu/src/accelkit_webgpu",
    "plugins/accelkit-dask/src/accelkit_dask", "tests", "tools/docs_check.py", "tools/docs_roles.py",
)  # fmt: skip
#: Where the docs site builds (mkdocs.yml's site_dir), and the inventory the docs check reads.
SITE = ROOT / "site"


def _static_commands(bin_dir: str) -> dict[str, list[tuple[str, ...]]]:
    """lint's, typecheck's and docs' commands, with the tools of the environment in ``bin_dir``.
    docs: the site, with every warning an error, then the check that its API reference holds
    every public name of ``accelkit`` and ``accelkit.sdk`` (tools/docs_check.py)."""
    ruff, mypy = os.path.join(bin_dir, "ruff"), os.path.join(bin_dir, "mypy")
    mkdocs, python = os.path.join(bin_dir, "mkdocs"), os.path.join(bin_dir, "python")
    return {
        "lint": [(ruff, "check", *LINTED), (ruff, "format", "--check", *LINTED)],
        "typecheck": [(mypy, "--strict", *TYPECHECKED)],
        "docs": [
            (mkdocs, "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
             "--site-dir", str(SITE)),
            (python, str(ROOT / "tools" / "docs_check.py"), "--inventory",
             str(SITE / "objects.inv")),
        ],
    }  # fmt: skip


def static_parts(parts: Any, bin_dir: str) -> list[Any]:
    """lint, typecheck and docs as parts of the tests session, each one process, run beside the
    tests (the commands of the ``lint``, ``typecheck`` and ``docs`` sessions, chained with
    ``&&``)."""
    found = []
    for name, commands in _static_commands(bin_dir).items():
        chained = " && ".join(shlex.join(c) for c in commands)
        found.append(parts.Part(name, command=("sh", "-c", chained)))
    return found


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check (also a part of ``nox -s tests``)."""
    session.install(STATIC_TOOLS[0])
    for command in _static_commands(session.bin)["lint"]:
        session.run(*command)


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the core, the device plugins, the example backend and the tests (CuPy
    has no type information: its imports are Any). Also a part of ``nox -s tests``, which runs
    it in the tests' environment (the drivers installed)."""
    # [test,testing]: what the tests import (pytest, hypothesis, the service test's web stack);
    # [docs]: griffe, which tools/docs_roles.py extends.
    session.install(
        "-e", ".[test,testing,docs]", "-e", "./plugins/accelkit-opencl", "-e", "./plugins/accelkit-cuda",
        "-e", "./plugins/accelkit-webgpu", "-e", "./plugins/accelkit-dask",
        "-e", "./tests/plugins/accelkit-example",
    )  # fmt: skip
    session.install(STATIC_TOOLS[1])
    for command in _static_commands(session.bin)["typecheck"]:
        session.run(*command)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The docs site (mkdocs.yml: the guide in docs/ and an API reference generated from the
    docstrings) built into site/ with ``mkdocs build --strict``, then checked: every name in the
    ``__all__`` of ``accelkit`` and ``accelkit.sdk`` must be documented (tools/docs_check.py).
    Also a part of ``nox -s tests``. ``python -m http.server -d site`` serves the result;
    ``mkdocs serve`` in this session's environment rebuilds it as you edit."""
    # with ruff, mkdocstrings formats the separate signatures, as in the tests session
    session.install("-e", ".[docs]", STATIC_TOOLS[0])
    for command in _static_commands(session.bin)["docs"]:
        session.run(*command)


@nox.session(python=PYTHON)
def fuzz(session: nox.Session) -> None:
    """The long Hypothesis profile of ``accelkit.testing.test_fuzz`` (hundreds of random examples
    per property, a new sample each run) on every installed backend, one process per backend.
    ``nox -s tests`` runs the same properties with the short, derandomized CI profile.
    ``ACCELKIT_FUZZ_PROFILE`` overrides the profile; arguments after ``--`` go to pytest."""
    session.install(
        "-e", ".[test,jit]", "-e", "./plugins/accelkit-opencl[pocl]", "-e",
        "./plugins/accelkit-cuda[cuda12-sysctk]", "-e", "./plugins/accelkit-webgpu",
        "-e", "./plugins/accelkit-dask", "./tests/plugins/accelkit-example",
    )  # fmt: skip
    session.env.setdefault("ACCELKIT_CPU_JIT", "eager")  # as in the tests session
    parts = _load_parts()
    env = _session_env(session)
    env.setdefault("ACCELKIT_FUZZ_PROFILE", "accelkit-fuzz")
    python = os.path.join(session.bin, "python")
    plan = [
        parts.Part(
            f"fuzz[{part.name.removeprefix('conformance[').removesuffix(']')}]",
            ("src/accelkit/testing/test_fuzz.py",),
            env=part.env,
            skip_reason=part.skip_reason,
        )
        for part in _test_parts(parts, python, env)
        if part.name.startswith("conformance[")
    ]
    with _shared_caches(env), _dask_cluster(python, env, plan):
        results = _run(
            parts, plan, python, env, session, "fuzz-parts", list(session.posargs), False
        )
    print("\n" + parts.format_summary(results), flush=True)
    failures = parts.session_failures(results, empty_ok=False)
    if failures:
        session.error("; ".join(failures))


@nox.session(python=PYTHON, venv_backend="virtualenv")
def bench(session: nox.Session) -> None:
    """Benchmarks, reported as ratios against NumPy and PyTorch (CPU) in the same process, and a
    plot of per-op cost against size (benchmarks/results/per_op_cost.png).

    pip rather than uv: pip finds the CPU build of PyTorch this machine keeps on disk, where uv
    would download a CUDA build of several GB.
    """
    session.install("-e", ".[jit]", "torch==2.13.0", "matplotlib")
    session.run("python", "benchmarks/bench_startup.py")
    session.run("python", "benchmarks/bench_core.py", *session.posargs)
