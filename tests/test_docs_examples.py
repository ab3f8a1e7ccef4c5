"""Every ```python example of README.md and docs/**/*.md runs, so that none can rot.

Each block is one test (its id is ``file:line`` of the opening fence), run as a script in a fresh
interpreter, in a scratch folder, with every cache in a folder of its own and the test plugins
(``accelkit-testplug-*``) disabled: what a user who copies the block sees. An interactive
session (``>>>`` lines) runs its statements; the output shown is illustrative.

A block may be marked by an HTML comment on the line right before its fence:

- ``<!-- example: skip (why) -->``: not run (it needs a GPU, a remote cluster, an installed
  plugin...); reported as a skip with that reason. It is still compiled.
- ``<!-- example: project tests/plugins/accelkit-example -->`` (anywhere on a page): the page's
  tutorial is that folder of this repository. Its scratch project starts as a copy of the folder,
  and every ``file`` block of the page must equal the folder's file of that path (so the page
  shows exactly the code the test session installs and certifies).
- ``<!-- example: excerpt src/pkg/module.py -->``: part of a tutorial's module (of the page's
  ``project``), shown but not run: it must appear in that file, verbatim.
- ``<!-- example: file src/pkg/module.py -->``: a module of a tutorial. Its test writes it, with
  the page's other file blocks, into a scratch project and imports it; the page's other blocks run
  with that project importable (``src/`` on ``PYTHONPATH``). Before a ```toml block,
  ``<!-- example: file pyproject.toml -->`` also installs the project's entry points there (as a
  ``.dist-info`` folder), so that accelkit discovers a tutorial's plugin as if pip had installed it.

A block that uses the ``opencl`` backend runs where accelkit-opencl and an OpenCL device exist
and is skipped, with the reason, elsewhere.

Also here: the README's two set-up commands are what CI runs, and the user-facing errors the
docs describe (``with`` instead of ``async with``; a misspelt backend name).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import io
import os
import re
import subprocess
import sys
import textwrap
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

import accelkit as ak
from accelkit.capabilities import LifecycleState
from accelkit.errors import BackendNotFoundError

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON_LANGS = {"python", "py", "python3"}
TIMEOUT_S = 120  # per example; each takes a second or two

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`{]*)")
_MARKER = re.compile(r"^\s*<!--\s*example:\s*(?P<kind>[a-z]+)\s*(?P<arg>.*?)\s*-->\s*$")
_CACHE_VARS = (
    "ACCELKIT_CACHE_DIR",
    "POCL_CACHE_DIR",
    "PYOPENCL_CACHE_DIR",
    "ACCELKIT_OPENCL_CACHE",
    "ACCELKIT_CUDA_CACHE",
)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # "", "skip" or "file"
    arg: str  # the skip's reason, the file's path

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.lang.lower() in PYTHON_LANGS

    def source(self) -> str:
        """The code to run: a ``>>>`` session's statements, or the block as it is."""
        lines = self.code.splitlines()
        if not any(line.startswith(">>>") for line in lines):
            return self.code
        return "".join(
            line[4:] + "\n" for line in lines if line.startswith((">>> ", "... ", ">>>", "..."))
        )


def fenced_blocks(doc: Path) -> list[Block]:
    """Every fenced block of a markdown page, with the marker of the line before it."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], m["lang"]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            line = lines[i]  # a fence indented by n spaces: n are removed from each line
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        marker = _MARKER.match(lines[start - 1]) if start else None
        kind, arg = (marker["kind"], marker["arg"]) if marker else ("", "")
        if kind == "skip":
            arg = arg.removeprefix("(").removesuffix(")").strip()
        code = "\n".join(body) + "\n"
        blocks.append(Block(doc, start + 1, lang, code, kind, arg))
        i += 1
    return blocks


ALL_BLOCKS = [block for doc in DOCS for block in fenced_blocks(doc)]
EXAMPLES = [block for block in ALL_BLOCKS if block.is_python]


@functools.cache
def _testplug_names() -> str:
    """Entry-point names of the test plugins (installed by the nox session): hidden from the
    examples, which show what a user's installation has."""
    names = {
        ep.name
        for ep in importlib.metadata.entry_points(group="accelkit.backends")
        if ep.dist is not None and ep.dist.name.startswith("accelkit-testplug-")
    }
    return ",".join(sorted(names))


@functools.cache
def opencl_missing() -> str:
    """Why the OpenCL examples cannot run here ('' when they can)."""
    if importlib.util.find_spec("accelkit_opencl") is None:
        return "accelkit-opencl is not installed"
    from accelkit.registry import Registry

    reg = Registry()  # a private one: nothing here touches the process-wide registry
    if "opencl" not in reg.names():
        return "accelkit-opencl is not registered (its entry point is missing)"
    try:
        found = reg.probe("opencl")
    except Exception as exc:  # a broken driver: not this test's business
        return f"the OpenCL probe failed: {exc}"
    return "" if found else f"no OpenCL device: {reg.unavailable_reason('opencl') or 'none found'}"


def uses_opencl(code: str) -> bool:
    """Whether the code names the opencl backend or an OpenCL device in a string (comments that
    mention it do not count)."""
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.STRING:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):  # an f-string: not a plain name
                continue
            if isinstance(value, str) and (value == "opencl" or value.startswith("opencl:")):
                return True
    return False


def example_env(scratch: Path, pythonpath: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    for var in _CACHE_VARS:
        folder = scratch / "caches" / var.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[var] = str(folder)
    if names := _testplug_names():
        env["ACCELKIT_DISABLE_PLUGINS"] = names
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), os.environ.get("PYTHONPATH", "")) if p
        )
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def page_project(doc: Path) -> Path | None:
    """The repository folder a page's ``project`` marker names (None without one)."""
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = _MARKER.match(line)
        if m and m["kind"] == "project":
            return ROOT / m["arg"]
    return None


def write_project(doc: Path, into: Path) -> Path:
    """Write the page's project (a copy of its ``project`` folder, then its file blocks) under
    ``into``; returns the folder to import them from.

    A ``pyproject.toml`` among them is "installed" there as a ``.dist-info`` folder with its
    entry points, which is what ``pip install`` gives accelkit to discover a plugin by."""
    files = [b for b in fenced_blocks(doc) if b.marker == "file"]
    paths = {b.arg: b.code for b in files}
    if (source := page_project(doc)) is not None:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).as_posix()
            if path.is_file() and "__pycache__" not in rel and ".egg-info" not in rel:
                paths.setdefault(rel, path.read_text(encoding="utf-8"))
    for rel, code in paths.items():
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code, encoding="utf-8")
    root = into / "src" if any(p.startswith("src/") for p in paths) else into
    root.mkdir(parents=True, exist_ok=True)
    for rel, code in paths.items():
        if rel == "pyproject.toml":
            project = tomllib.loads(code)["project"]
            name, version = project["name"], project.get("version", "0")
            info = root / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
            info.mkdir()
            meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            (info / "METADATA").write_text(meta, encoding="utf-8")
            groups = project.get("entry-points", {})
            entry_points = "".join(
                f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                for group, eps in groups.items()
            )
            (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
    return root


def module_name(path: str) -> str:
    parts = list(Path(path.removeprefix("src/")).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def run_python(code: str, cwd: Path, env: dict[str, str], label: str) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{label} ran past {TIMEOUT_S} s; output so far:\n{exc.stdout!s}\n{exc.stderr!s}"
        )
    if done.returncode != 0:
        pytest.fail(
            f"{label} failed with exit status {done.returncode}\n--- code ---\n{code}"
            f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-5000:]}",
            pytrace=False,
        )


# -- the examples ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.id for b in EXAMPLES])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    code = block.source()
    # Every block, skipped or not, is at least valid Python (an excerpt of a class, dedented).
    compile(textwrap.dedent(code), block.id, "exec")
    if block.marker == "skip":
        pytest.skip(f"{block.id}: {block.arg}")
    if block.marker == "excerpt":
        pytest.skip(
            f"{block.id}: an excerpt of {block.arg} (checked by test_tutorial_code_is_the_repository_code)"
        )
    if uses_opencl(code) and (why := opencl_missing()):
        pytest.skip(f"{block.id} uses the opencl backend: {why}")
    work = tmp_path / "work"
    work.mkdir()
    project = tmp_path / "project"
    has_files = page_project(block.doc) is not None or any(
        b.marker == "file" for b in fenced_blocks(block.doc)
    )
    path = write_project(block.doc, project) if has_files else None
    if block.marker == "file":
        code = f"import {module_name(block.arg)}\n"
    run_python(code, work, example_env(tmp_path, path), block.id)


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 15, [b.id for b in EXAMPLES]
    assert len({b.id for b in EXAMPLES}) == len(EXAMPLES)
    assert any(b.doc.name == "README.md" for b in EXAMPLES)


PROJECT_BLOCKS = [
    b
    for doc in DOCS
    if page_project(doc)
    for b in fenced_blocks(doc)
    if b.marker in ("file", "excerpt")
]


@pytest.mark.parametrize("block", PROJECT_BLOCKS, ids=[b.id for b in PROJECT_BLOCKS])
def test_tutorial_code_is_the_repository_code(block: Block) -> None:
    """A page that walks through a folder of this repository shows its files as they are."""
    folder = page_project(block.doc)
    assert folder is not None
    path = folder / block.arg
    assert path.is_file(), f"{block.id}: {path.relative_to(ROOT)} does not exist"
    text = path.read_text(encoding="utf-8")
    if block.marker == "file":
        assert block.code == text, f"{block.id} differs from {path.relative_to(ROOT)}"
    else:
        # An excerpt of a class body may be shown dedented.
        shown = textwrap.dedent(block.code)
        assert any(textwrap.indent(shown, " " * n) in text for n in (0, 4, 8)), (
            f"{block.id} is not an excerpt of {path.relative_to(ROOT)}"
        )


def test_markers_are_well_formed() -> None:
    """A marker sits right before a python block (or, for a file, a pyproject.toml block), and
    says why (skip) or where (file)."""
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        blocks = fenced_blocks(doc)
        starts = {b.line - 1 for b in blocks if b.is_python}
        starts |= {b.line - 1 for b in blocks if b.marker == "file" and b.lang == "toml"}
        starts |= {b.line - 1 for b in blocks if b.marker == "excerpt"}
        for number, line in enumerate(lines, start=1):
            if "<!-- example" not in line:
                continue
            m = _MARKER.match(line)
            where = f"{doc.relative_to(ROOT)}:{number}"
            assert m, f"{where}: malformed marker {line!r}"
            kinds = {"skip", "file", "excerpt", "project"}
            assert m["kind"] in kinds, f"{where}: unknown marker {m['kind']!r}"
            if m["kind"] == "project":
                assert (ROOT / m["arg"]).is_dir(), f"{where}: no folder {m['arg']}"
                continue
            assert number in starts, f"{where}: a marker must be right before a ```python fence"
            if m["kind"] in ("file", "excerpt") and not m["arg"].endswith(".py"):
                assert m["arg"] == "pyproject.toml", f"{where}: a file is a module or pyproject"
            assert m["arg"].strip("() "), f"{where}: a marker needs a reason or a path"


# -- the README's set-up commands are what CI runs -------------------------------------------------


def test_readme_setup_commands_are_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shell = [b.code.strip() for b in ALL_BLOCKS if b.doc.name == "README.md" and b.lang == "bash"]
    assert shell == ['pip install ".[jit]" && accelkit demo', "pip install nox uv && nox"], shell
    assert "two commands" in readme

    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(re.fullmatch(r"\s*(python -m )?nox(\s.*)?", line) for line in ci), ci
    assert any("pip install" in line and "nox" in line and "uv" in line for line in ci), ci
    assert "@nox.session" in (ROOT / "noxfile.py").read_text(encoding="utf-8")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"]["accelkit"] == "accelkit.__main__:main"
    assert any(dep.startswith("numba") for dep in project["optional-dependencies"]["jit"])
    from accelkit.cli import build_parser

    assert "demo" in build_parser().format_help()


def test_trio_is_a_dependency_since_the_docs_run_under_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert any(re.match(r"trio\b", dep) for dep in project["dependencies"])
    assert importlib.util.find_spec("trio") is not None


# -- the errors the docs describe -------------------------------------------------------------------


def test_plain_with_on_open_backend_says_async_with() -> None:
    with pytest.raises(TypeError, match="async with") as info, ak.open_backend("cpu"):
        pass  # pragma: no cover
    assert "anyio.run" in str(info.value)


@pytest.mark.anyio
async def test_async_with_on_open_backend_still_works() -> None:
    async with ak.open_backend("cpu") as backend:
        x = backend.tensor_factory.ones((2, 2))
        assert (await (x + x).to_host()).tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert backend.status.state is LifecycleState.SHUT_DOWN


def test_misspelt_backend_name_suggests_the_closest() -> None:
    for call in (
        lambda: ak.create_backend("cpuu"),
        lambda: ak.select(backend="cpuu"),
        lambda: ak.select("cpuu"),
        lambda: ak.registry.descriptor("cpuu"),
    ):
        with pytest.raises(BackendNotFoundError, match=r"did you mean 'cpu'\?"):
            call()


@pytest.mark.anyio
async def test_open_backend_with_a_misspelt_name_suggests_the_closest() -> None:
    with pytest.raises(BackendNotFoundError, match=r"did you mean 'cpu'\?"):
        async with ak.open_backend("cpuu"):
            pass  # pragma: no cover


def test_no_suggestion_for_a_name_like_none_installed() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        ak.create_backend("zzz")
    assert "did you mean" not in str(info.value)
