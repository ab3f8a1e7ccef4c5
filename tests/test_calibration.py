"""The calibration store: where it lives, the round trip, atomic writes, corrupt and foreign files
moved aside with a warning, and measured figures changing what the selector picks."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

import accelkit
from accelkit import DType, calibration
from accelkit.calibration import CalibrationEntry, CalibrationWarning
from accelkit.registry import Registry

SLOW_NAME = "FakeGPU Slow 100"  # the name the fakegpu test plugin's probe gives fakegpu:0


@pytest.fixture(autouse=True)
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("ACCELKIT_PLUGINS", "ACCELKIT_DISABLE_PLUGINS", "ACCELKIT_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ACCELKIT_DEVICE", raising=False)
    folder = tmp_path / "cache"
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def reg() -> Registry:
    return Registry()


def _entry(
    device: str = "fakegpu:0",
    *,
    backend: str = "fakegpu",
    name: str = SLOW_NAME,
    gflops: float = 100.0,
) -> CalibrationEntry:
    return CalibrationEntry(
        backend=backend,
        device=device,
        device_name=name,
        backend_version="0.1.0",
        gflops={DType.F32: gflops, DType.F64: gflops / 2},
        bandwidth_gbs=12.5,
        launch_latency_us=7.0,
        measured_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


def _save(*entries: CalibrationEntry) -> Path:
    return calibration.save({calibration.entry_key(e): e for e in entries})


# -- where it lives ---------------------------------------------------------------------------------
def test_the_file_lives_in_accelkit_cache_dir_read_when_used(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert calibration.calibration_path() == cache / "calibration.json"
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert calibration.cache_dir() == tmp_path / "elsewhere"
    # '~' is the home folder and a relative path is made absolute (they named './~/...' and a
    # different folder from every working directory).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", "~/.cache/mine")
    assert calibration.cache_dir() == tmp_path / "home" / ".cache" / "mine"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCELKIT_CACHE_DIR", "rel")
    assert calibration.cache_dir() == tmp_path / "rel"
    assert calibration.cache_dir().is_absolute()


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout is for Linux")
def test_without_override_it_is_the_user_cache_folder_with_no_extra_dependency(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ACCELKIT_CACHE_DIR")
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # not a dependency of accelkit
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert calibration.cache_dir() == tmp_path / "xdg" / "accelkit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration.cache_dir() == tmp_path / "home" / ".cache" / "accelkit"
    assert calibration.load() == {}  # no file there: nothing, and no error


# -- round trip -------------------------------------------------------------------------------------
def test_save_and_load_round_trip(cache: Path) -> None:
    entry = _entry()
    path = _save(entry)
    assert path == cache / "calibration.json"
    assert calibration.load() == {"fakegpu/fakegpu:0": entry}
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["format"] == "accelkit-calibration"
    assert raw["version"] == calibration.VERSION
    assert raw["entries"]["fakegpu/fakegpu:0"]["gflops"] == {"f32": 100.0, "f64": 50.0}
    assert calibration.lookup("fakegpu", "fakegpu:0", SLOW_NAME) == entry


def test_save_merges_over_what_is_stored() -> None:
    _save(_entry("fakegpu:0"), _entry("cpu:0", backend="cpu", name="host"))
    _save(_entry("fakegpu:0", gflops=7.0))
    entries = calibration.load()
    assert set(entries) == {"fakegpu/fakegpu:0", "cpu/cpu:0"}
    assert entries["fakegpu/fakegpu:0"].gflops[DType.F32] == 7.0


def test_a_rewrite_is_seen_at_once() -> None:
    for gflops in (1.0, 2.0, 3.0):
        _save(_entry(gflops=gflops))
        assert calibration.load()["fakegpu/fakegpu:0"].gflops[DType.F32] == gflops


def test_a_device_name_mismatch_ignores_the_entry(reg: Registry) -> None:
    _save(_entry(name="Some Other Card", gflops=1000.0))  # the card was swapped since
    assert calibration.lookup("fakegpu", "fakegpu:0", SLOW_NAME) is None
    sel = accelkit.select("fakegpu", registry=reg)
    assert sel.device == "fakegpu:1"
    assert {c.basis for c in sel.report.candidates} == {"declared"}


def test_entries_are_validated() -> None:
    with pytest.raises(ValidationError):
        CalibrationEntry.model_validate({**_entry().model_dump(), "bandwidth_gbs": -1.0})
    with pytest.raises(ValidationError, match="shell"):
        CalibrationEntry.model_validate({**_entry().model_dump(), "shell": "rm -rf /"})


# -- calibrated figures change the ranking ----------------------------------------------------------
def test_the_slow_device_calibrated_fast_wins(reg: Registry) -> None:
    before = accelkit.select("fakegpu", registry=reg)
    assert before.device == "fakegpu:1"
    _save(_entry("fakegpu:0", gflops=100.0))
    after = accelkit.select("fakegpu", registry=reg)
    assert after.device == "fakegpu:0"
    best, other = after.report.candidates
    assert (str(best.device), best.score, best.basis) == ("fakegpu:0", 100.0, "calibrated")
    assert (str(other.device), other.score, other.basis) == ("fakegpu:1", 4.0, "declared")
    assert "[calibrated]" in after.report.explain()
    # the memory policy ranks by declared memory, whatever was calibrated (it said "calibrated")
    by_memory = accelkit.select("fakegpu", policy="memory", registry=reg)
    assert {c.basis for c in by_memory.report.candidates} == {"declared"}


def test_calibrated_figures_follow_the_required_dtype(reg: Registry) -> None:
    _save(_entry("fakegpu:0", gflops=6.0))  # F32 6 > 4 declared; F64 3 > 2 declared
    sel = accelkit.select(
        "fakegpu", requires=accelkit.Requirements(dtypes={DType.F64}), registry=reg
    )
    assert [(str(c.device), c.score) for c in sel.report.candidates] == [
        ("fakegpu:0", 3.0),
        ("fakegpu:1", 2.0),
    ]


# -- corrupt and foreign files ----------------------------------------------------------------------
FOREIGN = [
    "{not json",
    "",
    "[]",
    json.dumps({"format": "something-else", "version": 1, "entries": {}}),
    json.dumps({"format": "accelkit-calibration", "version": 2, "entries": {}}),
    json.dumps({"format": "accelkit-calibration", "version": 1, "entries": {"x": {"a": 1}}}),
    json.dumps({"format": "accelkit-calibration", "version": 1, "entries": {}, "extra": 1}),
    "\xff\xfe not UTF-8",
    "[" * 100_000,  # deeper than json's parser goes: RecursionError crashed select() and the CLI
    # Figures no measurement gives (a 1e400 was accepted as inf, and select printed Infinity).
    '{"format": "accelkit-calibration", "version": 1, "entries": {"cpu/cpu:0": {"backend":'
    ' "cpu", "device": "cpu:0", "device_name": "x", "backend_version": "1", "gflops": {"f32":'
    ' 1e400}, "bandwidth_gbs": 1.0, "launch_latency_us": 1.0, "measured_at":'
    ' "2026-01-01T00:00:00Z"}}}',
]


@pytest.mark.parametrize("content", FOREIGN)
def test_a_corrupt_or_foreign_file_is_moved_aside_with_a_warning(cache: Path, content: str) -> None:
    cache.mkdir()
    path = cache / "calibration.json"
    path.write_text(content, encoding="latin-1")
    with pytest.warns(CalibrationWarning) as record:
        assert calibration.load() == {}
    message = str(record[0].message)
    assert str(path) in message
    assert "accelkit calibrate" in message
    assert not path.exists()
    aside = cache / "calibration.json.corrupt"
    assert aside.read_text(encoding="latin-1") == content  # kept for a look, never trusted
    assert str(aside) in message


def test_a_corrupt_file_is_ignored_by_the_selector_and_rewritten(
    cache: Path, reg: Registry
) -> None:
    cache.mkdir()
    (cache / "calibration.json").write_text('{"format": "accelkit-calibration", "vers', "utf-8")
    with pytest.warns(CalibrationWarning):
        sel = accelkit.select("fakegpu", registry=reg)
    assert sel.device == "fakegpu:1"
    assert {c.basis for c in sel.report.candidates} == {"declared"}
    _save(_entry())  # the next calibration writes a fresh file
    assert set(calibration.load()) == {"fakegpu/fakegpu:0"}


def test_an_oversized_file_is_not_read(cache: Path) -> None:
    cache.mkdir()
    (cache / "calibration.json").write_bytes(b" " * (calibration._MAX_BYTES + 1))
    with pytest.warns(CalibrationWarning, match="larger than"):
        assert calibration.load() == {}


# -- atomic writes ----------------------------------------------------------------------------------
def test_save_leaves_no_temporary_file(cache: Path) -> None:
    _save(_entry())
    _save(_entry(gflops=5.0))
    assert sorted(p.name for p in cache.iterdir()) == ["calibration.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(_entry(gflops=5.0))
    before = (cache / "calibration.json").read_bytes()

    def fail(src: object, dst: object) -> None:
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", fail)
        with pytest.raises(OSError, match="disk full"):
            _save(_entry(gflops=9.0))
    assert (cache / "calibration.json").read_bytes() == before
    assert sorted(p.name for p in cache.iterdir()) == ["calibration.json"]
    assert calibration.load()["fakegpu/fakegpu:0"].gflops[DType.F32] == 5.0


# -- measuring --------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_measure_a_backend_and_store_the_figures(reg: Registry) -> None:
    async with accelkit.open_backend("fakegpu:0", registry=reg) as backend:
        steps: list[str] = []
        entry = await calibration.measure(backend, SLOW_NAME, quick=True, progress=steps.append)
    assert (entry.backend, entry.device, entry.device_name) == ("fakegpu", "fakegpu:0", SLOW_NAME)
    assert entry.gflops[DType.F32] > 0
    assert entry.bandwidth_gbs > 0
    assert entry.launch_latency_us > 0
    assert any(s.startswith("GEMM") for s in steps)
    _save(entry)
    sel = accelkit.select("fakegpu:0", registry=reg)
    assert sel.report.candidates[0].basis == "calibrated"
    assert sel.report.candidates[0].score == entry.gflops[DType.F32]
