"""A template roll of a Python processor whose state schema changes, on the real control plane and Spark pods.

One Task, one shard, one scenario (each step costs a driver JVM start):

1. schema 1 (``count int, total double``) runs; results exact;
2. a compatible change (``count`` widened to bigint, ``last`` added with a default) rolls: the new pod resumes the
   same checkpoint and results stay exact;
3. an incompatible change (``count`` to string) rolls: the runtime refuses before processing anything; the shard is
   Failed/Degraded with reason ``StateSchemaIncompatible`` naming the column, the refused pod is kept (no crash loop:
   the same pod across many operator passes, one Warning event);
4. going back to the compatible schema rolls the refused shard: it resumes with every event it missed, exactly.
"""

from __future__ import annotations

import os
import random

import pytest

from spark_runtime.produce import append_events
from spark_runtime.results import final_results
from tests.cluster.operator_fixtures import apply, operator_crds, operator_process, task_manifest  # noqa: F401
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START = 300  # seconds: JVM start and first batches on a loaded 2-core machine
TASK = "roll"
SHARD = "roll-0-16"


def profile_task(data_dir, version: object) -> dict:
    task = task_manifest(TASK, data_dir)
    task["spec"]["processor"] = {"python": "tests.spark.engine_processors:Profile", "parameters": {"schema": version}}
    task["spec"]["spark"]["env"] = [{"name": "PYTHONPATH", "value": ROOT}]  # the test's processors module
    return task


class Events:
    """The journal's events (key, amount) and their plain-Python reference of the ``count`` result."""

    def __init__(self, data_dir) -> None:
        self.journal = data_dir / "journal" / TASK
        self.journal.mkdir(parents=True, exist_ok=True)
        self.counts: dict[str, int] = {}
        self.rng = random.Random(5)

    def write(self, n: int) -> None:
        events = [{"key": f"k{self.rng.randrange(40)}", "amount": float(self.rng.randrange(100))} for _ in range(n)]
        for e in events:
            self.counts[e["key"]] = self.counts.get(e["key"], 0) + 1
        append_events(self.journal, 2, events)


def result_counts(data_dir) -> dict[str, int]:
    found = final_results(data_dir / "output" / TASK, data_dir / "state", TASK)
    return {str(k): int(v["count"]) for k, v in found.items()}


def wait_exact(data_dir, events: Events, what: str) -> None:
    wait_for(lambda: result_counts(data_dir) == events.counts, START, f"exact counts {what}", interval=2.0)


def shard_status(kubectl) -> dict:
    return get_json(kubectl, "taskshard", SHARD).get("status") or {}


def driver(kubectl) -> dict:
    return get_json(kubectl, "pod", f"{SHARD}-driver")


def passes(op) -> float:
    """The operator's reconcile passes so far (Tasks and TaskShards; a resync passes both every 2 s)."""
    return sum(v for (name, _), v in op.metrics().items() if name == "taskshard_operator_passes_total")


def test_schema_rolls_exactly_or_stops_with_the_reason(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    events = Events(data)
    events.write(300)
    apply(kubectl, profile_task(data, 1))
    wait_exact(data, events, "on schema 1")

    # 2. A compatible change rolls the shard: same checkpoint, widened and added columns, exact.
    first_uid = driver(kubectl)["metadata"]["uid"]
    apply(kubectl, profile_task(data, 2))
    wait_for(lambda: driver(kubectl)["metadata"]["uid"] != first_uid, START, "the roll to replace the pod")
    events.write(300)
    wait_exact(data, events, "after the compatible roll")

    # 3. An incompatible change is refused before anything runs, and held there.
    apply(kubectl, profile_task(data, "bad"))
    events.write(100)  # not processed while the template is refused

    def refused():
        conds = {c["type"]: c for c in shard_status(kubectl).get("conditions", [])}
        degraded = conds.get("Degraded") or {}
        return degraded.get("reason") == "StateSchemaIncompatible" and degraded

    degraded = wait_for(refused, START, "the shard to show StateSchemaIncompatible")
    assert "'count'" in degraded["message"], degraded
    assert shard_status(kubectl)["phase"] == "Failed"
    held = driver(kubectl)
    assert held["status"]["phase"] == "Succeeded", "the runtime refused and exited 0"
    seen = passes(operator_process)
    wait_for(lambda: passes(operator_process) >= seen + 10, 120, "ten more reconcile passes of the operator")
    assert driver(kubectl)["metadata"]["uid"] == held["metadata"]["uid"], "the refused pod was not restarted"
    warnings = get_json(kubectl, "events", "--field-selector", "reason=StateSchemaIncompatible")["items"]
    assert sum(int(e.get("count") or 1) for e in warnings) == 1, warnings
    task = get_json(kubectl, "task", TASK)["status"]
    assert task["phase"] == "Degraded", task

    # 4. The fix rolls to the refused shard first; it resumes with what it missed, exactly.
    apply(kubectl, profile_task(data, 2))
    wait_for(lambda: driver(kubectl)["metadata"]["uid"] != held["metadata"]["uid"], START, "the fix to replace it")
    wait_exact(data, events, "after the fix")
    wait_for(lambda: shard_status(kubectl).get("phase") == "Running", START, "the shard to run again")
