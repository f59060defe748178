"""A session-window Task with event time on the real control plane and Spark pods: applied with kubectl, split twice
with sessions open and timers pending, closed sessions exact against a plain-Python sessionization; the watermark
and the late records in status.live of the shards and the Task.

One Task, one scenario (each split costs driver JVM starts).
"""

from __future__ import annotations

import os
import random

import pytest

from spark_runtime.keygroups import key_group
from spark_runtime.produce import append_events
from spark_runtime.results import read_committed, read_sink
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    operator_crds,
    operator_process,
    split,
    task_manifest,
    wait_phases,
)
from tests.spark.time_processors import reference_sessions
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = 300  # seconds: JVM start and first batches on a loaded 2-core machine
TASK = "sess"
GAP_MS = 5_000
MAX_KEY_GROUPS = 16


class Clicks:
    """The journal's events (``key``, ``ts``), moving forward in event time, and the late ones sent on purpose."""

    def __init__(self, data_dir) -> None:
        self.journal = data_dir / "journal" / TASK
        self.journal.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(13)
        self.t = 1_800_000_000_000
        self.events: list[tuple[str, int]] = []
        self.late = 0

    def write(self, n: int, late: int = 0) -> None:
        batch = []
        for _ in range(n):
            self.t += self.rng.randrange(0, 300)
            batch.append({"key": f"u{self.rng.randrange(20)}", "ts": self.t + self.rng.randrange(0, 900)})
        self.events += [(e["key"], e["ts"]) for e in batch]
        batch += [{"key": f"u{i}", "ts": 1_000 + i} for i in range(late)]  # far behind the watermark
        self.late += late
        append_events(self.journal, 2, batch)

    def close_all(self, ranges: list[tuple[int, int]]) -> None:
        """One event far ahead for a key of each range: every shard's watermark passes every open session."""
        ends = []
        for start, end in ranges:
            key = next(f"end{i}" for i in range(1000) if start <= key_group(f"end{i}", MAX_KEY_GROUPS) < end)
            ends.append({"key": key, "ts": self.t + 10**9})
        append_events(self.journal, 2, ends)


def session_task(data_dir) -> dict:
    task = task_manifest(TASK, data_dir, max_key_groups=MAX_KEY_GROUPS)
    task["spec"]["processor"] = {"python": "tests.spark.time_processors:SessionWindow", "parameters": {"gapSeconds": 5}}
    task["spec"]["eventTime"] = {"field": "ts", "maxOutOfOrdernessSeconds": 1}
    task["spec"]["spark"]["env"] = [{"name": "PYTHONPATH", "value": ROOT}]  # the test's processors module
    return task


def sessions(data_dir) -> list[tuple]:
    committed = read_committed(data_dir / "state", TASK)
    records = read_sink(data_dir / "output" / TASK, committed)
    return [(r["key"], r["start"], r["end"], r["count"]) for r in records if not r["key"].startswith("end")]


def live(kubectl, kind: str, name: str) -> dict:
    return (get_json(kubectl, kind, name).get("status") or {}).get("live") or {}


def test_sessions_stay_exact_across_two_splits(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    clicks = Clicks(data)
    clicks.write(300)
    apply(kubectl, session_task(data))
    wait_phases(kubectl, {"sess-0-16": "Running"}, START, operator_process)
    # Late only once a batch set a watermark: the first batch of a shard runs with none.
    wait_for(lambda: live(kubectl, "taskshard", "sess-0-16").get("batchId", -1) >= 0, START, "a first commit")
    clicks.write(200, late=3)
    wait_for(lambda: live(kubectl, "taskshard", "sess-0-16").get("lateRecords") == 3, START, "3 late records")
    assert live(kubectl, "taskshard", "sess-0-16")["watermark"].startswith("2027-01-15")  # 1.8e12 ms, minus 1 s

    split(kubectl, "sess-0-16")
    wait_phases(kubectl, {"sess-0-16": "Split", "sess-0-8": "Running", "sess-8-16": "Running"}, START, operator_process)
    clicks.write(300, late=2)
    split(kubectl, "sess-8-16", at=12)
    wait_phases(kubectl, {"sess-8-16": "Split", "sess-8-12": "Running", "sess-12-16": "Running"}, START)
    clicks.write(200)
    clicks.close_all([(0, 8), (8, 12), (12, 16)])

    expected = reference_sessions(clicks.events, GAP_MS)
    wait_for(lambda: len(sessions(data)) >= len(expected), START, f"{len(expected)} closed sessions", interval=2.0)
    got = sessions(data)
    assert len(got) == len(set(got)), "a session was emitted twice"
    assert set(got) == expected
    # Each late record is counted once, by the shard that owned its key then (split parents keep their figures);
    # the Task sums its active shards, as it does dead letters.
    every = ("sess-0-16", "sess-0-8", "sess-8-16", "sess-8-12", "sess-12-16")
    late = lambda names: sum(live(kubectl, "taskshard", n).get("lateRecords") or 0 for n in names)  # noqa: E731
    wait_for(lambda: late(every) == clicks.late, 120, f"{clicks.late} late records over all shards")
    active = ("sess-0-8", "sess-8-12", "sess-12-16")
    task_live = lambda: live(kubectl, "task", TASK)  # noqa: E731
    wait_for(lambda: task_live().get("lateRecords") == late(active), 120, "the Task's late records summed")
    assert task_live()["watermark"] >= "2027-01-15"
