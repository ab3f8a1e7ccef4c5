"""Environment settings: parsed strictly, read each time they are used, and a malformed value is an
error naming the variable, the value and the accepted forms."""

from __future__ import annotations

import pytest

from accelkit._core.env import env_flag, env_name, env_names, env_seconds, env_str
from accelkit.errors import InvalidArgumentError

VAR = "ACCELKIT_TEST_SETTING"


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)


# -- env_flag ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", " yes ", "on", "On"])
def test_flag_true_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_flag(VAR) is True
    assert env_flag(VAR, default=False) is True


@pytest.mark.parametrize("value", ["0", "false", "False", " no", "off", "OFF", "", "   "])
def test_flag_false_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_flag(VAR, default=True) is False


@pytest.mark.parametrize("default", [True, False])
def test_flag_unset_gives_the_default(default: bool) -> None:
    assert env_flag(VAR, default=default) is default


@pytest.mark.parametrize("value", ["maybe", "2", "y", "n", "-1", "truee", "0.0", "enabled"])
def test_flag_malformed_is_an_error_naming_variable_value_and_forms(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(VAR, value)
    with pytest.raises(InvalidArgumentError) as info:
        env_flag(VAR, default=True)
    message = str(info.value)
    assert f"{VAR}={value!r}" in message
    assert "1/true/yes/on" in message
    assert "0/false/no/off" in message


def test_flag_is_read_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_flag(VAR) is False
    monkeypatch.setenv(VAR, "yes")
    assert env_flag(VAR) is True
    monkeypatch.setenv(VAR, "no")
    assert env_flag(VAR, default=True) is False


# -- env_str ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [("  cpu  ", "cpu"), ("a b", "a b"), ("", None)])
def test_str_is_stripped_and_empty_means_unset(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str | None
) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_str(VAR) == expected


def test_str_unset_is_none() -> None:
    assert env_str(VAR) is None


# -- env_names --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("cpu", {"cpu"}),
        ("cpu,opencl", {"cpu", "opencl"}),
        (" CPU , OpenCL ,, ", {"cpu", "opencl"}),
        ("fake_gpu2", {"fake_gpu2"}),
    ],
)
def test_names_parse_a_comma_separated_list(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: set[str]
) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_names(VAR) == frozenset(expected)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_names_unset_or_empty_is_none(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is not None:
        monkeypatch.setenv(VAR, value)
    assert env_names(VAR) is None


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ("cpu;opencl", "'cpu;opencl'"),
        ("cpu opencl", "'cpu opencl'"),
        ("cpu,9lives", "'9lives'"),
        ("cpu,fake-gpu", "'fake-gpu'"),
        ("cpu,accelkit.backends", "'accelkit.backends'"),
    ],
)
def test_names_malformed_is_an_error_naming_the_bad_item(
    monkeypatch: pytest.MonkeyPatch, value: str, bad: str
) -> None:
    monkeypatch.setenv(VAR, value)
    with pytest.raises(InvalidArgumentError) as info:
        env_names(VAR)
    message = str(info.value)
    assert f"{VAR}={value!r}" in message
    assert bad in message
    assert "comma-separated list like 'cpu,opencl'" in message


@pytest.mark.parametrize("value", [",", " , ,", ",,,"])
def test_names_naming_nothing_is_an_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Separators alone are a mistake in an allow list: as a list of nothing,
    ACCELKIT_PLUGINS=',' disabled every plugin. A deny list of nothing denies nothing."""
    monkeypatch.setenv("ACCELKIT_PLUGINS", value)
    with pytest.raises(InvalidArgumentError, match="names no plugin"):
        env_names("ACCELKIT_PLUGINS")
    monkeypatch.setenv("ACCELKIT_DISABLE_PLUGINS", value)
    assert env_names("ACCELKIT_DISABLE_PLUGINS") == frozenset()


@pytest.mark.parametrize(("value", "expected"), [("cpu", "cpu"), (" OpenCL ", "opencl")])
def test_name_parses_one_backend_name(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_name(VAR) == expected


@pytest.mark.parametrize("value", ["cpu;x", "cpu,opencl", "9lives", "fake-gpu"])
def test_name_malformed_is_an_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(VAR, value)
    with pytest.raises(InvalidArgumentError, match=r"is not a backend name; expected one name"):
        env_name(VAR)


# -- env_seconds ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [("300", 300.0), (" 2.5 ", 2.5), ("0", 0.0)])
def test_seconds_parse(monkeypatch: pytest.MonkeyPatch, value: str, expected: float) -> None:
    monkeypatch.setenv(VAR, value)
    assert env_seconds(VAR, 7.0) == expected


def test_seconds_unset_or_empty_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_seconds(VAR, 7.0) == 7.0
    monkeypatch.setenv(VAR, " ")
    assert env_seconds(VAR, 7.0) == 7.0


@pytest.mark.parametrize("value", ["5s", "five", "-1", "nan", "inf", "-0.5"])
def test_seconds_malformed_is_an_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """'5s' and 'five' became the default, -1 killed the isolation watchdog's thread, NaN
    turned hang detection off (ACCELKIT_ISOLATE_DEADLINE_S)."""
    monkeypatch.setenv(VAR, value)
    with pytest.raises(InvalidArgumentError, match=f"{VAR}={value!r} is not a number of seconds"):
        env_seconds(VAR, 7.0)
