"""The drain crash hook's variable (spark_runtime.faults): unset injects nothing, a step arms that step only, and
anything else is refused naming the variable, the value and the steps. The crashes themselves are
tests/spark/test_drain_crashes.py's."""

from __future__ import annotations

import time

import pytest

from spark_runtime import faults
from spark_runtime.faults import DRAIN_STEPS, KILL_AT_DRAIN_STEP_ENV, FaultConfigError, kill_at_drain_step

pytestmark = pytest.mark.unit


def test_unset_or_empty_injects_nothing():
    assert kill_at_drain_step({}) is None
    assert kill_at_drain_step({KILL_AT_DRAIN_STEP_ENV: "  "}) is None


@pytest.mark.parametrize("step", DRAIN_STEPS)
def test_each_step_is_accepted(step):
    assert kill_at_drain_step({KILL_AT_DRAIN_STEP_ENV: f" {step} "}) == step


@pytest.mark.parametrize("value", ["exporting", "Marker", "1", "mid_export"])
def test_an_unknown_step_is_refused_with_the_variable_value_and_steps(value):
    with pytest.raises(FaultConfigError) as err:
        kill_at_drain_step({KILL_AT_DRAIN_STEP_ENV: value})
    message = str(err.value)
    assert KILL_AT_DRAIN_STEP_ENV in message and repr(value) in message
    assert all(step in message for step in DRAIN_STEPS)


def test_the_first_check_refuses_an_unknown_step(monkeypatch):
    monkeypatch.setenv(KILL_AT_DRAIN_STEP_ENV, "nope")
    with pytest.raises(FaultConfigError, match=KILL_AT_DRAIN_STEP_ENV):
        faults.crash_point("marker")


def test_other_steps_and_an_unset_variable_do_not_crash(monkeypatch):
    died: list[str] = []
    monkeypatch.setattr(faults, "_die", lambda step, detail="": died.append(step))
    monkeypatch.delenv(KILL_AT_DRAIN_STEP_ENV, raising=False)
    for step in DRAIN_STEPS:
        faults.crash_point(step)
    monkeypatch.setenv(KILL_AT_DRAIN_STEP_ENV, "exported")
    for step in DRAIN_STEPS:
        faults.crash_point(step)
    assert died == ["exported"]
    with pytest.raises(ValueError, match="unknown drain step"):  # a caller's typo
        faults.crash_point("exporting")


def test_crash_when_fires_once_the_probe_holds(monkeypatch):
    died: list[str] = []
    monkeypatch.setattr(faults, "_die", lambda step, detail="": died.append(step))
    monkeypatch.setenv(KILL_AT_DRAIN_STEP_ENV, "mid-export")
    calls = iter([False, False, True])
    with faults.crash_when("mid-export", lambda: next(calls, False)):
        deadline = time.monotonic() + 5
        while not died and time.monotonic() < deadline:
            time.sleep(0.01)
    assert died[:1] == ["mid-export"]
    died.clear()
    with faults.crash_when("exported", lambda: True):  # not the named step: the probe is never asked
        pass
    assert died == []


def test_export_in_progress(tmp_path):
    from spark_runtime.storage import location

    state = location(tmp_path / "state")
    assert not faults.export_in_progress(state)  # nothing yet
    part = tmp_path / "state" / "_temporary" / "0" / "key_group=3" / "part-0.parquet"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x")
    assert faults.export_in_progress(state)
    (tmp_path / "state" / "_SUCCESS").write_bytes(b"")
    assert not faults.export_in_progress(state)  # finished
