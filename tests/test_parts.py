"""The test-session machinery (tests/support/parts.py): parts run as separate pytest processes,
one that passes, one that fails and one that kills itself with SIGABRT; the summary table, the
totals line CI reads, and the session's verdict."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import pytest

from support import parts
from support.parts import Counts, Part, PartResult

PASSING = """
import pytest

def test_one():
    pass

def test_two():
    pass

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""

FAILING = """
def test_ok():
    pass

def test_bad():
    assert 1 == 2
"""

ABORTING = """
import os
import sys

def test_before():
    pass

def test_abort():
    sys.stderr.write("LLVM ERROR: Cannot select: 0x55c3b6de03e8: i64 = fma 0x1234567, 0x7654321\\n")
    sys.stderr.write("In function: _Z7_cl_fmaDv16_fS_S_\\n")
    sys.stderr.flush()
    os.abort()

def test_after():
    pass
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder of small test files, with a pytest.ini so that pytest stays there."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_passing.py").write_text(PASSING)
    (root / "test_failing.py").write_text(FAILING)
    (root / "test_aborting.py").write_text(ABORTING)
    return root


def run(project: Path, *plan: Part, **kw: object) -> tuple[list[PartResult], str]:
    out = io.StringIO()
    results = parts.run_parts(
        plan,
        cwd=project,
        log_dir=project.parent / "logs",
        out=out,
        **kw,  # type: ignore[arg-type]
    )
    return results, out.getvalue()


def test_a_passing_a_failing_and_an_aborting_part(project: Path) -> None:
    results, live = run(
        project,
        Part("good", ("test_passing.py",)),
        Part("bad", ("test_failing.py",)),
        Part("crash", ("test_aborting.py",)),
        Part("later", ("test_passing.py",)),  # the parts after a crash still run
    )
    good, bad, crash, later = results
    assert (good.outcome, good.returncode, good.counts) == ("passed", 0, Counts(2, 0, 1))
    assert (bad.outcome, bad.returncode, bad.counts) == ("failed", 1, Counts(1, 1, 0))
    assert crash.outcome == "crashed"
    assert crash.returncode == -signal.SIGABRT
    assert crash.label == "crashed: SIGABRT"
    # the test that passed before the crash, and the one that was running (counted as failed)
    assert crash.counts == Counts(passed=1, failed=1, skipped=0)
    assert crash.running == ["test_aborting.py::test_abort"]
    assert "test_aborting.py::test_abort" in crash.detail
    assert "LLVM ERROR: Cannot select: i64 = fma" in crash.detail
    assert "0x55c3b6de03e8" not in crash.detail
    assert "In function: _Z7_cl_fmaDv16_fS_S_" in crash.detail
    assert later.outcome == "passed"

    # the output was shown live, the faulthandler's traceback included, and kept in a file
    assert "=== part crash:" in live
    assert "Fatal Python error: Aborted" in live
    assert "test_abort" in live.split("Fatal Python error: Aborted", 1)[1]
    assert "Fatal Python error: Aborted" in Path(crash.output_path).read_text()

    summary = parts.format_summary(results)
    lines = summary.splitlines()
    assert lines[-1] == "6 passed, 2 failed, 2 skipped"
    table = {line.split()[0]: line for line in lines[1:7]}
    assert table["good"].split() == ["good", "passed", "2", "0", "1", *table["good"].split()[-3:]]
    assert "crashed: SIGABRT" in table["crash"]
    assert "crash: crashed: SIGABRT: in test_aborting.py::test_abort: LLVM ERROR" in summary

    failures = parts.session_failures(results)
    assert len(failures) == 2
    assert failures[0].startswith("bad: failed")
    assert failures[1].startswith("crash: crashed: SIGABRT")
    assert parts.session_failures([good, later]) == []


def test_no_tests_is_a_failure_unless_the_arguments_filtered_them(project: Path) -> None:
    results, _ = run(project, Part("good", ("test_passing.py",)), extra_args=("-k", "nothing"))
    (empty,) = results
    assert (empty.outcome, empty.returncode) == ("no tests", 5)
    assert parts.session_failures(results) == ["good: no tests collected"]
    # with a filter from the developer, a part it leaves empty is fine, as long as some part ran
    results, _ = run(
        project,
        Part("good", ("test_passing.py",)),
        Part("bad", ("test_failing.py",)),
        extra_args=("-k", "test_ok"),
        empty_ok=True,
    )
    assert [r.outcome for r in results] == ["no tests", "passed"]
    assert parts.session_failures(results, empty_ok=True) == []
    assert parts.totals_line(results) == "1 passed, 0 failed, 0 skipped"
    # ... and where no part ran any test, the session fails, as pytest would
    results, _ = run(
        project, Part("good", ("test_passing.py",)), extra_args=("-k", "zzz"), empty_ok=True
    )
    assert parts.session_failures(results, empty_ok=True) == ["no part selected any test"]


def test_a_part_not_run_for_a_reason_shows_and_fails_nothing(project: Path) -> None:
    results, live = run(project, Part("conformance[cuda]", skip_reason="no device: no driver"))
    (skipped,) = results
    assert (skipped.outcome, skipped.returncode, skipped.counts) == ("no tests", None, None)
    assert live == ""
    assert parts.session_failures(results) == []
    summary = parts.format_summary(results)
    assert "conformance[cuda]: no tests: no device: no driver" in summary
    assert summary.splitlines()[-1] == "0 passed, 0 failed, 0 skipped"


def test_a_hanging_part_is_stopped_at_its_timeout(project: Path) -> None:
    (project / "test_hang.py").write_text(
        "import time\n\ndef test_first():\n    pass\n\ndef test_hang():\n    time.sleep(600)\n"
    )
    results, _ = run(project, Part("hang", ("test_hang.py",)), timeout=10)
    (hang,) = results
    assert hang.outcome == "timed out"
    assert hang.counts == Counts(passed=1, failed=1)
    assert "after 10 s in test_hang.py::test_hang" in hang.detail
    assert parts.session_failures(results) == [
        "hang: timed out (after 10 s in test_hang.py::test_hang)"
    ]


def test_a_crash_at_interpreter_exit_after_every_test_passed(project: Path) -> None:
    (project / "conftest.py").write_text(
        "import atexit, os\n\ndef pytest_unconfigure(config):\n    atexit.register(os.abort)\n"
    )
    results, _ = run(project, Part("exit", ("test_passing.py",)))
    (exit_,) = results
    assert exit_.label == "crashed: SIGABRT"
    assert exit_.counts == Counts(2, 0, 1)  # every test ran; the process died afterwards
    assert exit_.detail.startswith("after the last test")
    assert parts.session_failures(results)


def test_counts_from_pytest_output_when_there_is_no_event_log() -> None:
    out = (
        "tests/test_x.py ..F.s\n"
        "=========== 1 failed, 3 passed, 1 skipped, 2 xfailed, 1 error, 4 deselected in 0.52s"
        " ===========\n"
    )
    assert parts.counts_from_output(out) == Counts(passed=3, failed=2, skipped=3)
    assert parts.counts_from_output("=== no tests ran in 0.01s ===") == Counts()
    assert parts.counts_from_output("Fatal Python error: Aborted") is None


def test_summary_of_a_part_that_died_before_its_first_test() -> None:
    result = PartResult("early", "crashed", returncode=-signal.SIGSEGV, counts=Counts(failed=1))
    summary = parts.format_summary([result])
    assert "crashed: SIGSEGV" in summary
    assert summary.splitlines()[-1] == "0 passed, 1 failed, 0 skipped"


def test_the_event_log_plugin_is_importable_without_pytest_running(tmp_path: Path) -> None:
    """noxfile.py loads this module by path in nox's own interpreter: standard library only."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('p', {str(parts.__file__)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['p'] = m\n"
        "spec.loader.exec_module(m)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('pytest', '_pytest', 'accelkit'))\n"
        "print(bad)\n"
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_PART")},
            "PYTHONPATH": "",
        },
        timeout=60,
    )
    assert out.stdout.strip() == "[]"


def test_split_runs_each_test_once_between_the_core_and_the_per_backend_parts(
    project: Path,
) -> None:
    per_backend = project / "per_backend"
    per_backend.mkdir()
    (per_backend / "test_backends.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture(params=['a', 'b'])\n"
        "def backend(request):\n    return request.param\n\n"
        "def test_on_each_backend(backend):\n    pass\n\n"
        "def test_backend_free():\n    pass\n"
    )
    paths, fixtures = ["per_backend"], ["backend"]
    results, live = run(
        project,
        Part("core", ("per_backend", "test_passing.py"), env=parts.split(paths, fixtures, "other")),
        Part("backends", ("per_backend",), env=parts.split(paths, fixtures, "backend")),
    )
    core, backends = results
    assert core.counts == Counts(passed=3, skipped=1)  # test_backend_free and test_passing.py
    assert backends.counts == Counts(passed=2)  # test_on_each_backend[a] and [b]
    assert "2 deselected" in live


def test_a_part_alongside_runs_while_the_next_ones_do_and_shows_its_output_after(
    project: Path,
) -> None:
    # The background part waits for a file the foreground part writes: it can only pass if
    # both run at the same time.
    flag = project / "flag"
    (project / "test_waits.py").write_text(
        "import pathlib, time\n\n"
        "def test_waits_for_the_other_part():\n"
        f"    flag = pathlib.Path({str(flag)!r})\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not flag.exists():\n"
        "        assert time.monotonic() < deadline, 'the parts did not run at the same time'\n"
        "        time.sleep(0.05)\n"
    )
    (project / "test_writes.py").write_text(
        "import pathlib, time\n\n"
        "def test_writes_the_flag():\n"
        f"    time.sleep(1)\n    pathlib.Path({str(flag)!r}).write_text('x')\n"
    )
    results, live = run(
        project,
        Part("waits", ("test_waits.py",), alongside=True),
        Part("writes", ("test_writes.py",)),
    )
    assert [(r.name, r.outcome) for r in results] == [("waits", "passed"), ("writes", "passed")]
    # the background part's output comes after the foreground part's, not inside it
    assert live.index("=== part writes: passed") < live.index("=== part waits: passed")


def test_a_part_may_have_a_timeout_of_its_own(project: Path) -> None:
    (project / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(3)\n")
    results, _ = run(
        project,
        Part("own", ("test_slow.py",), timeout=1.0),
        Part("runner's", ("test_slow.py",)),
        timeout=30.0,
    )
    assert [r.outcome for r in results] == ["timed out", "passed"]


def test_parts_run_two_at_a_time_and_their_outputs_never_interleave(project: Path) -> None:
    # Two parts that can only pass when they run at the same time (each waits for the other's
    # flag), a third that waits for a free slot; a crash in one ends only that one.
    a_flag, b_flag = project / "a-flag", project / "b-flag"
    for name, mine, theirs in (("a", a_flag, b_flag), ("b", b_flag, a_flag)):
        (project / f"test_meet_{name}.py").write_text(
            "import pathlib, time\n\n"
            f"def test_meets_{name}():\n"
            f"    pathlib.Path({str(mine)!r}).write_text('x')\n"
            "    deadline = time.monotonic() + 60\n"
            f"    while not pathlib.Path({str(theirs)!r}).exists():\n"
            "        assert time.monotonic() < deadline, 'the parts did not run side by side'\n"
            "        time.sleep(0.05)\n"
            f"    print('output of part {name}')\n"
        )
    results, live = run(
        project,
        Part("a", ("test_meet_a.py", "-s")),
        Part("b", ("test_meet_b.py", "-s")),
        Part("crash", ("test_aborting.py",)),
        Part("after", ("test_passing.py",)),
        jobs=2,
    )
    assert [(r.name, r.outcome) for r in results] == [
        ("a", "passed"),
        ("b", "passed"),
        ("crash", "crashed"),
        ("after", "passed"),
    ]
    # each part's output is shown whole: its header, its tests' output and its verdict together
    for name in ("a", "b"):
        block = live.split(f"=== part {name}: -X faulthandler", 1)[1]
        block = block.split(f"=== part {name}: passed", 1)[0]
        assert f"output of part {name}" in block
        other = "b" if name == "a" else "a"
        assert f"output of part {other}" not in block


def test_the_summary_names_a_part_over_its_share_and_the_slowest_modules(project: Path) -> None:
    (project / "test_slow.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(1.2)\n\ndef test_quick():\n    pass\n"
    )
    results, _ = run(
        project,
        Part("slow", ("test_slow.py", "test_passing.py"), budget=0.5),
        Part("roomy", ("test_passing.py",), budget=600.0),
    )
    slow, roomy = results
    assert slow.over_budget
    assert not roomy.over_budget
    assert slow.modules["test_slow.py"] >= 1.2
    assert slow.modules["test_slow.py"] > slow.modules["test_passing.py"]
    summary = parts.format_summary(results)
    assert "warning: part slow took" in summary
    assert "over its share of the budget (0 s)" in summary
    assert "warning: part roomy" not in summary
    assert "slow: test_slow.py 1 s" in summary
    assert summary.splitlines()[-1] == "6 passed, 0 failed, 2 skipped"
    assert parts.session_failures(results) == []  # a warning, not a failure


def test_a_command_part_passes_or_fails_by_its_exit_status(project: Path) -> None:
    results, live = run(
        project,
        Part("lint-ok", command=(sys.executable, "-c", "print('all clean')")),
        Part("lint-bad", command=(sys.executable, "-c", "import sys; sys.exit(3)")),
        extra_args=("-k", "nothing"),  # pytest options never reach a command
    )
    assert [(r.name, r.outcome) for r in results] == [("lint-ok", "passed"), ("lint-bad", "failed")]
    assert "all clean" in live
    assert results[0].counts is None  # no tests: nothing added to the totals
    assert parts.session_failures(results) == ["lint-bad: failed (exit status 3)"]


ONE_LOOP = """
import pytest

pytestmark = pytest.mark.anyio

@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param

@pytest.mark.one_loop
@pytest.mark.parametrize("n", [1, 2])
async def test_kernel_{i}(n, anyio_backend):
    pass

async def test_execution_model_{i}(anyio_backend):
    pass
"""


@pytest.mark.parametrize("loops", ["", "both"])
def test_one_loop_tests_run_under_one_loop_each_unless_both_are_asked_for(
    project: Path, loops: str
) -> None:
    # eight marked functions: both loops get some, each function one loop (both: every loop)
    (project / "test_loops.py").write_text(
        "\n".join(ONE_LOOP.replace("{i}", str(i)) for i in range(8))
    )
    env = {**os.environ, "ACCELKIT_TEST_LOOPS": loops}
    _results, live = run(project, Part("loops", ("test_loops.py", "-v")), env=env)
    ran = [line.split(" PASSED")[0] for line in live.splitlines() if " PASSED" in line]
    marked = [r for r in ran if "test_kernel_" in r]
    unmarked = [r for r in ran if "test_execution_model_" in r]
    assert len(unmarked) == 16  # 8 functions x 2 loops: the marker alone changes anything
    if loops == "both":
        assert len(marked) == 32
        return
    assert len(marked) == 16  # 8 functions x 2 params, each under one loop
    loop_of: dict[str, str] = {}
    for r in marked:
        function = r.split("::")[1].split("[")[0]
        loop = "trio" if "trio" in r else "asyncio"
        assert loop_of.setdefault(function, loop) == loop  # a function never changes loop
    assert set(loop_of.values()) == {"asyncio", "trio"}
    assert "16 deselected" in live


def test_processes_of_one_run_share_the_compiler_caches_it_names(tmp_path: Path) -> None:
    import subprocess

    show = (
        "import os; from accelkit.testing.plugin import isolate_compiler_caches;"
        " print(isolate_compiler_caches(), os.environ['NUMBA_CACHE_DIR'],"
        " os.environ['POCL_CACHE_DIR'])"
    )
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith(("_CACHE_DIR", "_CACHE", "_VARIANTS_FILE", "_VERDICTS"))
        and k != "ACCELKIT_TEST_CACHES"
    }

    def caches(**extra: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", show], env={**clean, **extra}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    shared = str(tmp_path / "run-caches")
    first, second = caches(ACCELKIT_TEST_CACHES=shared), caches(ACCELKIT_TEST_CACHES=shared)
    # the program caches are shared; Numba's index (one file, rewritten) is each process's own
    assert first[2] == second[2] == os.path.join(shared, "pocl")
    assert first[0] != second[0]
    assert first[1] == os.path.join(first[0], "numba")
    assert second[1] == os.path.join(second[0], "numba")
    alone, other = caches(), caches()  # without it: a new folder per process, for everything
    assert alone[0] != other[0]
    assert alone[2] == os.path.join(alone[0], "pocl")


def test_shards_of_a_part_run_each_test_once_between_them(project: Path) -> None:
    (project / "test_many.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(7))\ndef test_each(i):\n    pass\n"
    )
    results, live = run(
        project,
        *(Part(f"many {i}/3", ("test_many.py", "-v"), env=parts.shard(i, 3)) for i in (1, 2, 3)),
        jobs=2,
    )
    assert [r.counts for r in results] == [Counts(passed=3), Counts(passed=2), Counts(passed=2)]
    ran = sorted(line.split(" PASSED")[0] for line in live.splitlines() if " PASSED" in line)
    assert ran == sorted(f"test_many.py::test_each[{i}]" for i in range(7))
    with pytest.raises(ValueError, match="shard 4/3"):
        parts.shard(4, 3)
