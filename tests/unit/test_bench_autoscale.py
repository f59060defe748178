"""The pure part of ``bench/autoscale.py`` (the autoscale benchmark): the summary of recorded samples, the
hand-over durations, the page's lines (``summarize``), and the verdict of its target (met only when the Task grew,
kept the lag under the target by the step's end, came back to one shard, and the results were exact)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "autoscale.py"
ARGS = argparse.Namespace(base=40.0, factor=4.0, target_lag=30, cooldown=120, max_shards=4)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_autoscale", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sample(t, active, desired, lag):
    return {"t": t, "active": active, "desired": desired, "worstLagSeconds": lag, "producerRate": 40.0}


def run(samples, exact=True):
    return {"samples": samples, "stepStart": 100.0, "stepEnd": 400.0, "exact": exact, "produced": 1000}


GOOD = [
    sample(0, 1, 1, 0),
    sample(150, 1, 2, 45),
    sample(200, 2, 2, 40),
    sample(250, 2, 3, 50),
    sample(300, 3, 3, 20),
    sample(390, 3, 3, 10),
    sample(600, 3, 2, 0),
    sample(650, 2, 2, 0),
    sample(800, 2, 1, 0),
    sample(850, 1, 1, 0),
]


def test_a_task_that_grows_keeps_up_and_shrinks_back_meets_the_target(bench):
    assert bench._handovers(GOOD) == [(1, 2, 50), (2, 3, 50), (3, 2, 50), (2, 1, 50)]
    summary = bench.evaluate(run(GOOD), ARGS)
    (target,) = summary["targets"]
    assert target["met"] and target["value"] == "peak 3 shards, last-minute lag 10 s, back to 1 after 450 s, exact"
    rows = {r[0]: r[1] for r in summary["rows"]}
    assert rows["scale-ups (t after the step began)"] == "100 s, 200 s"
    assert rows["scale-downs (t after the step ended)"] == "250 s, 450 s"


@pytest.mark.parametrize(
    ("samples", "exact", "why"),
    [
        (GOOD, False, "the results were not exact"),
        (GOOD[:6], True, "the Task was not back at one shard before the tail ended"),
        ([*GOOD[:5], sample(390, 3, 3, 999_999)], True, "the worst lag over the step's last minute was no progress"),
        ([sample(0, 1, 1, 0), sample(390, 1, 1, 5), sample(500, 1, 1, 0)], True, "the Task never grew"),
    ],
)
def test_each_way_to_miss_is_named(bench, samples, exact, why):
    (target,) = bench.evaluate(run(samples, exact), ARGS)["targets"]
    assert not target["met"] and why in target["why"], target


def test_summarize_reads_the_result_file(bench):
    data = {"parameters": vars(ARGS), "raw": run(GOOD)}
    first, second = bench.summarize(data)
    assert first.startswith("On a 4x rate step: peak 3 shards, last-minute lag 10 s, back to 1 after 450 s, exact")
    assert "(target lag <= 30 s, back to 1, exact: met)" in first and "scale-ups 100 s, 200 s" in first
    assert second.endswith("1->2: 50 s, 2->3: 50 s, 3->2: 50 s, 2->1: 50 s.")
