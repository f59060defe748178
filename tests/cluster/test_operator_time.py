"""A session-window Task with event time on the real control plane and Spark pods: applied with kubectl, split twice
with sessions open and timers pending, closed sessions exact against a plain-Python sessionization; the watermark
and the late records in status.live of the shards and the Task (its watermark never goes back across the
hand-overs, its late records count every shard's, split parents' too).

One Task, one scenario (each split costs driver JVM starts).
"""

from __future__ import annotations

import os
import random
import threading

import pytest

from spark_runtime.keygroups import key_group
from spark_runtime.produce import append_events
from spark_runtime.protocol import rfc3339
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

    def ahead(self, start: int, end: int, seconds: int) -> int:
        """Jump ``seconds`` ahead in event time with events for keys of ``[start, end)`` only: that range's shard
        runs ahead in event time of the others. Returns the watermark it reaches (ms; later events come after it)."""
        self.t += seconds * 1000
        keys = [f"u{i}" for i in range(20) if start <= key_group(f"u{i}", MAX_KEY_GROUPS) < end]
        batch = [{"key": key, "ts": self.t} for key in keys]
        self.events += [(e["key"], e["ts"]) for e in batch]
        append_events(self.journal, 2, batch)
        return self.t - 1_000

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
    # The children skip their standby rehearsal (a warm-up only, proven by the demo test and the Spark tier): this
    # test is about windows and timers across hand-overs, and four rehearsals on 2 cores cost minutes.
    task["spec"]["spark"]["conf"]["spark.taskshard.rehearse"] = "false"
    return task


def sessions(data_dir) -> list[tuple]:
    committed = read_committed(data_dir / "state", TASK)
    records = read_sink(data_dir / "output" / TASK, committed)
    return [(r["key"], r["start"], r["end"], r["count"]) for r in records if not r["key"].startswith("end")]


def live(kubectl, kind: str, name: str) -> dict:
    return (get_json(kubectl, kind, name).get("status") or {}).get("live") or {}


class Watching:
    """The Task's ``status.live.watermark`` as polled every second (a thread; one pooled API read per poll)."""

    def __init__(self, kubectl) -> None:
        self.kubectl, self.seen = kubectl, []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopped.wait(1.0):
            try:
                mark = live(self.kubectl, "task", TASK).get("watermark")
            except Exception:  # noqa: BLE001 - the Task not created yet, an API hiccup: poll on
                continue
            if mark and (not self.seen or self.seen[-1] != mark):
                self.seen.append(mark)

    def stop(self) -> list[str]:
        """Stop polling (idempotent); the watermarks seen, each change once."""
        self.stopped.set()
        self.thread.join(timeout=10)
        return self.seen


def test_sessions_stay_exact_across_two_splits(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    clicks = Clicks(data)
    clicks.write(300)
    apply(kubectl, session_task(data))
    watching = Watching(kubectl)
    try:
        run_scenario(kubectl, operator_process, data, clicks, watching)
    finally:
        watching.stop()


def run_scenario(kubectl, process, data, clicks: Clicks, watching: Watching) -> None:
    """Two splits with sessions open and late records; sess-0-8 runs ahead in event time before the second."""
    wait_phases(kubectl, {"sess-0-16": "Running"}, START, process)
    # Late only once a batch set a watermark: the first batch of a shard runs with none.
    wait_for(lambda: live(kubectl, "taskshard", "sess-0-16").get("batchId", -1) >= 0, START, "a first commit")
    clicks.write(200, late=3)
    wait_for(lambda: live(kubectl, "taskshard", "sess-0-16").get("lateRecords") == 3, START, "3 late records")
    assert live(kubectl, "taskshard", "sess-0-16")["watermark"].startswith("2027-01-15")  # 1.8e12 ms, minus 1 s

    split(kubectl, "sess-0-16")
    wait_phases(kubectl, {"sess-0-16": "Split", "sess-0-8": "Running", "sess-8-16": "Running"}, START, process)
    clicks.write(300, late=2)
    # sess-0-8 runs a minute ahead in event time: while sess-8-16's children have not reported yet, the Task's
    # watermark must not jump to sess-0-8's and fall back to their floor once they report.
    ahead = rfc3339(clicks.ahead(0, 8, 60) / 1000)
    wait_for(lambda: live(kubectl, "taskshard", "sess-0-8").get("watermark", "") >= ahead, START, "sess-0-8 ahead")
    split(kubectl, "sess-8-16", at=12)
    wait_phases(kubectl, {"sess-8-16": "Split", "sess-8-12": "Running", "sess-12-16": "Running"}, START)
    clicks.write(200)
    clicks.close_all([(0, 8), (8, 12), (12, 16)])

    expected = reference_sessions(clicks.events, GAP_MS)
    wait_for(lambda: len(sessions(data)) >= len(expected), START, f"{len(expected)} closed sessions", interval=2.0)
    got = sessions(data)
    assert len(got) == len(set(got)), "a session was emitted twice"
    assert set(got) == expected
    marks = watching.stop()
    assert len(marks) >= 2 and marks == sorted(marks), f"the Task's watermark went back: {marks}"
    # Each late record is counted once, by the shard that owned its key then (split parents keep their figures);
    # the Task counts every shard's over its life, split parents' too, as it does dead letters.
    every = ("sess-0-16", "sess-0-8", "sess-8-16", "sess-8-12", "sess-12-16")
    late = lambda names: sum(live(kubectl, "taskshard", n).get("lateRecords") or 0 for n in names)  # noqa: E731
    wait_for(lambda: late(every) == clicks.late, 120, f"{clicks.late} late records over all shards")
    task_live = lambda: live(kubectl, "task", TASK)  # noqa: E731
    wait_for(lambda: task_live().get("lateRecords") == clicks.late, 120, "the Task's late records: all shards'")
    assert task_live()["watermark"] >= "2027-01-15"
