"""The pure helpers of ``bench/executors.py`` (executors against local mode): the medians and their ratios, the
tables' rows, the Targets rows and the page's lines (``summarize``) from a recorded result."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ex():
    return load("bench_executors", "executors.py")


@pytest.fixture(scope="module")
def run_all():
    return load("bench_run_all", "run_all.py")


def run(repeat: int, mode: str, seconds: float, driver: float, executors: float = 0.0, exact: bool = True) -> dict:
    events = 100_000
    total = driver + executors
    return {
        "repeat": repeat,
        "mode": mode,
        "events": events,
        "seconds": seconds,
        "eventsPerSecond": round(events / seconds),
        "batches": 10,
        "cpuSeconds": total,
        "driverCpuSeconds": driver,
        "executorCpuSeconds": executors,
        "executorShare": round(executors / total, 3) if mode == "executors" else None,
        "cpuMicrosPerEvent": round(total / events * 1e6, 2),
        "cpuKinds": {"JIT compilers": 1.0, "GC": 0.5, "other JVM": total - 2.5, "Python": 1.0},
        "cpuKindsByGroup": {"driver": {"JIT compilers": 1.0, "GC": 0.5, "other JVM": driver - 2.5, "Python": 1.0}}
        | (
            {"executors": {"JIT compilers": 0.0, "GC": 0.0, "other JVM": executors, "Python": 0.0}} if executors else {}
        ),
        "executorPods": ["s-exec-1", "s-exec-2"] if mode == "executors" else [],
        "executorTasks": {"s-exec-1": 20, "s-exec-2": 19} if mode == "executors" else {},
        "idleCores": 0.05,
        "machine": {"busy": total + 1.0, "idle": 0.1, "steal": 0.0, "stealPercent": 0.0},
        "stealPercent": 0.0,
        "load1": 2.0,
        "exact": exact,
        "check": {
            "wrongKeys": 0 if exact else 3,
            "missingKeys": 0,
            "extraKeys": 0,
            "eventsCounted": 99_997,
            "eventsExpected": 100_000,
        },
    }


RESULTS = [
    run(1, "local", 4.0, 8.0),
    run(1, "executors", 8.0, 4.0, 12.0),
    run(2, "local", 5.0, 9.0),
    run(2, "executors", 10.0, 5.0, 13.0),
    run(3, "local", 4.5, 8.5),
    run(3, "executors", 9.0, 4.5, 12.5),
]


def test_summary_takes_medians_per_mode_and_ratios_of_the_medians(ex):
    s = ex.medians(RESULTS, ["local", "executors"])
    local, execs = s["modes"]["local"], s["modes"]["executors"]
    assert local["runs"] == execs["runs"] == 3
    assert local["eventsPerSecond"] == 22_222  # 100,000 / 4.5 s
    assert execs["eventsPerSecond"] == 11_111  # 100,000 / 9 s
    assert local["cpuMicrosPerEvent"] == 85.0 and execs["cpuMicrosPerEvent"] == 170.0
    assert local["executorShare"] is None
    assert execs["executorShare"] == pytest.approx(12.5 / 17.0, abs=1e-3)
    assert s["ratios"]["eventsPerSecond"] == pytest.approx(0.5, abs=1e-3)
    assert s["ratios"]["cpuPerEvent"] == 2.0
    assert [p["repeat"] for p in s["ratios"]["paired"]] == [1, 2, 3]
    assert s["ratios"]["paired"][0] == {"repeat": 1, "eventsPerSecond": 0.5, "cpuPerEvent": 2.0}
    assert local["exact"] and execs["exact"]


def test_summary_with_one_mode_has_no_ratios(ex):
    s = ex.medians([r for r in RESULTS if r["mode"] == "local"], ["local"])
    assert s["ratios"]["eventsPerSecond"] is None and s["ratios"]["cpuPerEvent"] is None
    assert s["ratios"]["paired"] == []
    assert len(ex.summary_rows(s)) == 1  # no ratio row


def test_table_rows(ex):
    rows = ex.run_rows(RESULTS)
    assert all(len(r) == len(ex.RUN_COLUMNS) for r in rows)
    local, execs = rows[0], rows[1]
    col = ex.RUN_COLUMNS.index
    assert local[col("executor pods")] is None and execs[col("executor pods")] == 2
    assert execs[col("executors' share of the CPU %")] == 75.0
    assert execs[col("tasks finished on executors")] == 39
    assert local[col("results exact")] is True
    s = ex.medians(RESULTS, ["local", "executors"])
    summary = ex.summary_rows(s)
    assert all(len(r) == len(ex.SUMMARY_COLUMNS) for r in summary)
    assert summary[-1][0].startswith("executors / local")
    assert summary[-1][ex.SUMMARY_COLUMNS.index("CPU µs / event (median)")] == 2.0
    kinds = ex.kind_rows(RESULTS)
    assert all(len(r) == len(ex.KIND_COLUMNS) for r in kinds)
    assert [r[2] for r in kinds[:3]] == ["driver", "driver", "executors"]
    assert ex.pair_rows(s)[1] == [2, 0.5, 2.0]


def test_targets_exact_and_reported_ratios(ex):
    s = ex.medians(RESULTS, ["local", "executors"])
    exact, eps, cpu = ex.targets(RESULTS, s, 2)
    assert exact["name"] == "2 executors: results exact" and exact["target"] == "exact" and exact["met"]
    assert exact["value"].startswith("exact in 3 of 3 runs")
    assert eps["name"] == "2 executors: events/s vs local mode (ratio; reported)"
    assert eps["target"] == "reported" and eps["met"] and eps["value"].startswith("0.50x (11,111 vs 22,222 events/s")
    assert cpu["name"] == "2 executors: CPU per event vs local mode (ratio; reported)"
    assert cpu["met"] and cpu["value"].startswith("2.00x (170.0 vs 85.0 CPU µs / event")


def test_targets_missed_when_not_exact_or_not_measured(ex):
    results = [*RESULTS[:3], run(2, "executors", 10.0, 5.0, 13.0, exact=False)]
    s = ex.medians(results, ["local", "executors"])
    exact = ex.targets(results, s, 2)[0]
    assert not exact["met"] and exact["value"].startswith("exact in 1 of 2 runs")
    assert "repeat 2: 3 keys wrong" in exact["why"]
    only_local = [r for r in RESULTS if r["mode"] == "local"]
    rows = ex.targets(only_local, ex.medians(only_local, ["local"]), 2)
    assert [r["met"] for r in rows] == [False, False, False]
    assert all(r["value"] == "not measured" for r in rows)


def test_compare_counts(ex):
    expected = Counter({"a": 2, "b": 1})
    assert ex.compare_counts({"a": 2, "b": 1}, expected)["exact"]
    check = ex.compare_counts({"a": "3", "c": 1}, expected)
    assert not check["exact"]
    assert (check["wrongKeys"], check["missingKeys"], check["extraKeys"]) == (1, 1, 1)
    assert check["eventsCounted"] == 4 and check["eventsExpected"] == 3


def test_container_pid_and_manifest(ex):
    pod = {"status": {"containerStatuses": [{"containerID": "local://4242", "state": {"running": {}}}]}}
    assert ex.container_pid(pod) == 4242
    gone = {"status": {"containerStatuses": [{"containerID": "local://4242", "state": {"terminated": {}}}]}}
    assert ex.container_pid(gone) is None
    assert ex.container_pid({"status": {}}) is None
    args = argparse.Namespace(trigger="200 milliseconds", executors=2, executor_memory="1Gi", data=Path("/d"))
    local = ex.task_manifest("local1", "local", args, {"spark.ui.enabled": "false"})
    execs = ex.task_manifest("exec1", "executors", args, {"spark.ui.enabled": "false"})
    assert "executors" not in local["spec"]["spark"] and "serviceAccountName" not in local["spec"]["spark"]
    assert execs["spec"]["spark"]["executors"] == {"instances": 2, "resources": {"limits": {"memory": "1Gi"}}}
    assert execs["spec"]["spark"]["serviceAccountName"] == "taskshard-spark"
    assert execs["spec"]["maxKeyGroups"] == 128
    assert execs["spec"]["source"]["journal"] == {"path": "/data/journal/exec1", "partitions": 4}
    assert execs["spec"]["storage"]["volume"] == {"hostPath": "/d", "mountPath": "/data"}


def test_summarize_and_target_rows_from_a_recorded_result(ex, run_all):
    s = ex.medians(RESULTS, ["local", "executors"])
    data = {
        "parameters": {"executors": 2, "events": 100_000},
        "machine": {"cores": 2},
        "targets": ex.targets(RESULTS, s, 2),
        "raw": {"summary": s, "results": RESULTS},
    }
    text = "\n".join(ex.summarize(data))
    assert "11,111 events/s against 22,222 in local mode (0.50x)" in text
    assert "170.0 CPU µs per event against 85.0 (2.00x" in text
    assert "compete with the driver for the same 2 cores" in text and "not a speed-up" in text
    assert "Results exact in all 6 runs" in text
    spec = run_all.BENCHMARKS["executors"]
    assert spec.script == "bench/executors.py" and spec.result == "executors"
    assert spec.number == 11 and sorted(b.number for b in run_all.BENCHMARKS.values()) == list(range(1, 18))
    assert spec.summarize({"raw": {}}) == []  # another shape: no lines, no error


def test_pod_tree_cpu_counts_a_root_added_in_the_window_also_after_it_exits(ex):
    busy = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print('burnt', flush=True)\ntime.sleep(1.0)\n"
    )
    cpu = ex.PodTreeCpu({}, interval=60.0)  # no background samples: only the readings below
    before = cpu.reading(threads=False)
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert cpu.add(f"exec-1@{child.pid}", child.pid)
        assert not cpu.add(f"exec-1@{child.pid}", child.pid)
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        cpu.reading(threads=False)  # sampled while it sleeps, its 0.3 s burnt
    finally:
        child.communicate(timeout=60)
    after = cpu.reading(threads=False)  # the root has exited (reaped by this process): its last sample counts
    assert child.pid not in after["alive"]
    assert 0.25 <= cpu.seconds(before, after, f"exec-1@{child.pid}") <= 1.5
