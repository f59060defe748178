"""Template rolls of Python processors on the real control plane and Spark pods (each step costs a driver JVM
start, so each test is one Task's life).

:func:`test_schema_rolls_exactly_or_stops_with_the_reason`: a processor whose state schema changes, one shard:

1. schema 1 (``count int, total double``) runs; results exact;
2. a compatible change (``count`` widened to bigint, ``last`` added with a default) rolls: the new pod resumes the
   same checkpoint and results stay exact;
3. an incompatible change (``count`` to string) rolls: the runtime refuses before processing anything; the shard is
   Failed/Degraded with reason ``StateSchemaIncompatible`` naming the column, the refused pod is kept (no crash loop:
   the same pod across many operator passes, one Warning event);
4. going back to the compatible schema rolls the refused shard: it resumes with every event it missed, exactly.

:func:`test_the_users_fix_reaches_a_failing_shard_first` (#53): a processor that raises on one record, fixed by a
Task edit, first with one shard, then with two where the failing one is not first in key-group order.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from spark_runtime.keygroups import key_group
from spark_runtime.produce import append_events
from spark_runtime.results import final_results, read_committed, read_sink
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    operator_crds,
    operator_process,
    split,
    task_manifest,
    wait_phases,
)
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


# ---------------------------------------------------------------- the user's fix reaches a failing shard (#53)
POISON = "poison"
FIX = {"spec": {"processor": {"parameters": {"failKey": None, "failValue": None}}}}
"""The user's fix, as in the issue: ``kubectl patch task poison --type merge -p ...``."""


def poison_task(data_dir, fail_key: str, fail_value: float) -> dict:
    task = task_manifest(POISON, data_dir)
    task["spec"]["processor"] = {
        "python": "tests.spark.engine_processors:Poison",
        "parameters": {"failKey": fail_key, "failValue": fail_value},
    }
    task["spec"]["spark"]["env"] = [{"name": "PYTHONPATH", "value": ROOT}]  # the test's processors module
    return task


def key_in(start: int, end: int) -> str:
    """A key whose key group (of 16) lies in ``[start, end)``."""
    return next(f"x{i}" for i in range(1000) if start <= key_group(f"x{i}", 16) < end)


class Journal:
    """The Poison Task's input: good events (amounts >= 0), poison records, dead letters; the reference counts."""

    def __init__(self, data_dir) -> None:
        self.journal = data_dir / "journal" / POISON
        self.journal.mkdir(parents=True, exist_ok=True)
        self.counts: dict[str, int] = {}
        self.dead = 0
        self.rng = random.Random(53)

    def write(self, n: int, *, poison: tuple[str, float] | None = None, dead_key: str | None = None) -> None:
        events = [{"key": f"k{self.rng.randrange(40)}", "amount": float(self.rng.randrange(100))} for _ in range(n)]
        if poison is not None:
            events.append({"key": poison[0], "amount": poison[1]})
        for e in events:
            self.counts[e["key"]] = self.counts.get(e["key"], 0) + 1  # the fixed processor counts every event
        if dead_key is not None:
            events.append({"key": dead_key, "amount": "not a number"})  # a dead letter, never counted
            self.dead += 1
        append_events(self.journal, 2, events)


class Failing:
    """What a failing shard shows and leaves on storage while its processor raises, read to compare after the fix."""

    def __init__(self, data_dir, kubectl, shard: str) -> None:
        self.shard = shard
        self.checkpoint = data_dir / "state" / POISON / "shards" / shard / "checkpoint"
        self.dead_dir = data_dir / "output" / POISON / "_dead_letters" / f"shard={shard}"

        def failed():
            status = get_json(kubectl, "taskshard", shard).get("status") or {}
            degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
            return status.get("phase") == "Failed" and degraded.get("reason") == "ProcessorFailed" and degraded

        self.degraded = wait_for(failed, START, f"{shard} Failed with Degraded ProcessorFailed")
        self.batch = self.last_committed() + 1
        self.offsets = (self.checkpoint / "offsets" / str(self.batch)).read_bytes()
        self.dead_letters = self.dead_letter_files()

    def last_committed(self) -> int:
        commits = [int(f.name) for f in (self.checkpoint / "commits").iterdir() if f.name.isdigit()]
        return max(commits, default=-1)

    def dead_letter_files(self) -> dict[str, bytes]:
        files = sorted(self.dead_dir.glob("*.jsonl")) if self.dead_dir.is_dir() else []
        return {f.name: f.read_bytes() for f in files}

    def check_failed(self) -> None:
        """Nothing at or past the poison record committed while it fails."""
        assert "ValueError: cannot process key" in self.degraded["message"], self.degraded
        assert self.last_committed() == self.batch - 1, f"{self.shard} committed past the poison record"

    def check_recovered(self, data_dir) -> None:
        """The failing batch committed once, with the offsets it was planned with; dead letters as before."""
        wait_for(lambda: self.last_committed() >= self.batch, START, f"{self.shard} to commit batch {self.batch}")
        assert (self.checkpoint / "offsets" / str(self.batch)).read_bytes() == self.offsets, "replanned"
        committed = read_committed(data_dir / "state", POISON)
        records = [
            r
            for r in read_sink(data_dir / "output" / POISON, committed)
            if r["shard"] == self.shard and r["batch"] == self.batch
        ]
        keys = [r["key"] for r in records]
        assert keys and len(keys) == len(set(keys)), f"batch {self.batch} of {self.shard} written once: {keys}"
        assert self.dead_letter_files() == self.dead_letters, "the replay changed the dead letters"


def poison_counts(data_dir) -> dict[str, int]:
    found = final_results(data_dir / "output" / POISON, data_dir / "state", POISON)
    return {str(k): int(v) for k, v in found.items()}


def pod_hashes(kubectl) -> dict[str, tuple[str, str]]:
    """Per shard: its driver pod's template hash and uid."""
    pods = get_json(kubectl, "pods", "-l", f"taskshard.io/task={POISON},taskshard.io/component=shard")["items"]
    return {
        p["metadata"]["labels"]["taskshard.io/shard"]: (
            p["metadata"]["annotations"]["taskshard.io/template-hash"],
            p["metadata"]["uid"],
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def task_status(kubectl) -> dict:
    return get_json(kubectl, "task", POISON).get("status") or {}


def patch_task(kubectl, patch: dict) -> str:
    """``kubectl patch task poison --type merge -p PATCH``; returns the new template hash once the Task shows it."""
    before = task_status(kubectl).get("templateHash")
    kubectl("patch", "task", POISON, "--type", "merge", "-p", json.dumps(patch))

    def changed():
        now = task_status(kubectl).get("templateHash")
        return now if now not in (None, before) else None

    return wait_for(changed, 60, "the Task's new template hash")


def phase_changes(kubectl, shard: str) -> set[str]:
    """The shard's phase transitions so far, from its PhaseX events (``"Failed -> Running"``, ...)."""
    events = get_json(kubectl, "events", "--field-selector", f"involvedObject.name={shard}")["items"]
    return {e["message"].partition(": phase ")[2] for e in events if e.get("reason", "").startswith("Phase")}


def dead_letters(data_dir) -> list[str]:
    """Every dead-letter record of the Task (all shards' files): the bad lines, each once."""
    root = data_dir / "output" / POISON / "_dead_letters"
    return [line for f in sorted(root.glob("shard=*/*.jsonl")) for line in f.read_text().splitlines() if line.strip()]


def test_the_users_fix_reaches_a_failing_shard_first(kubectl, operator_process, tmp_path):  # noqa: F811
    """#53: a processor raises on one record; the shard is Failed (ProcessorFailed) and commits nothing past it.
    The user's fix (the Task's processor parameters) rolls to it first, whatever its crash-loop back-off: it
    recovers, the failing batch commits once with its original offsets, results are exact per key and the dead
    letters unchanged. Then the same with two shards, the failing one second in key-group order: the fix goes to
    it before the healthy one."""
    began = time.monotonic()
    data = tmp_path / "data"
    journal = Journal(data)
    low_key, high_key = key_in(0, 8), key_in(8, 16)
    journal.write(200)
    apply(kubectl, poison_task(data, low_key, -1.0))
    wait_for(lambda: poison_counts(data) == journal.counts, START, "exact counts before the poison", interval=2.0)

    # 1. One shard: the poison record (with a dead letter in the same batch) fails it; the fix rolls to it.
    journal.write(50, poison=(low_key, -1.0), dead_key=high_key)
    failing = Failing(data, kubectl, "poison-0-16")
    failing.check_failed()
    patch_task(kubectl, FIX)
    wait_for(lambda: poison_counts(data) == journal.counts, START, "exact counts after the fix", interval=2.0)
    failing.check_recovered(data)
    wait_phases(kubectl, {"poison-0-16": "Running"}, START, operator_process)
    # The fix reached it while Failed, and it stayed Failed until its new pod committed: no Failed -> Running
    # (an old pod that ran a minute) -> Pending (the roll of a "Running" shard) on the way.
    changes = phase_changes(kubectl, "poison-0-16")
    assert "Running -> Failed" in changes and "Failed -> Running" in changes, changes
    assert "Running -> Pending" not in changes and "Failed -> Pending" not in changes, changes
    assert len(dead_letters(data)) == journal.dead == 1

    # 2. Two shards, the second fails: a new bug (rolled to the one shard), a split (the children start with it),
    # the poison record of a key in [8, 16), and the fix, which goes to poison-8-16 before poison-0-8.
    buggy = patch_task(kubectl, {"spec": {"processor": {"parameters": {"failKey": high_key, "failValue": -2.0}}}})
    wait_for(lambda: pod_hashes(kubectl).get("poison-0-16", ("",))[0] == buggy, START, "the new bug rolled")
    wait_phases(kubectl, {"poison-0-16": "Running"}, START, operator_process)
    split(kubectl, "poison-0-16")
    wait_phases(
        kubectl, {"poison-0-16": "Split", "poison-0-8": "Running", "poison-8-16": "Running"}, START, operator_process
    )
    journal.write(100)
    wait_for(lambda: poison_counts(data) == journal.counts, START, "exact counts after the split", interval=2.0)
    journal.write(50, poison=(high_key, -2.0), dead_key=high_key)
    failing = Failing(data, kubectl, "poison-8-16")
    failing.check_failed()
    healthy = pod_hashes(kubectl)["poison-0-8"]
    assert healthy[0] == buggy
    fixed = patch_task(kubectl, FIX)

    def failing_rolled():
        pods = pod_hashes(kubectl)
        return pods.get("poison-8-16", ("",))[0] == fixed and pods

    pods = wait_for(failing_rolled, START, "the fix to reach poison-8-16")
    assert pods["poison-0-8"] == healthy, "the failing shard rolled first; the healthy one waits for it"
    wait_for(lambda: poison_counts(data) == journal.counts, START, "exact counts after the second fix", interval=2.0)
    failing.check_recovered(data)
    wait_for(lambda: pod_hashes(kubectl).get("poison-0-8", ("",))[0] == fixed, START, "then the healthy shard rolled")
    wait_phases(kubectl, {"poison-0-8": "Running", "poison-8-16": "Running"}, START, operator_process)
    changes = phase_changes(kubectl, "poison-8-16")
    assert "Failed -> Running" in changes and "Running -> Pending" not in changes, changes

    def settled():
        status = task_status(kubectl)
        progressing = next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})
        return status.get("phase") == "Running" and progressing.get("reason") == "Stable" and status

    wait_for(settled, START, "the Task Running, its roll done")
    assert len(dead_letters(data)) == journal.dead == 2, "each dead letter recorded once"
    assert poison_counts(data) == journal.counts
    print(f"\n[poison] one Task's life: {time.monotonic() - began:.0f} s")
