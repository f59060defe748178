"""Aborting a split and deleting a shard mid-split, end to end (real control plane, node agent, Spark pods).

``test_a_withdrawn_split_is_undone_and_a_parent_deleted_mid_split_finishes_it``: a Task with one shard is split
``by: state`` (the shard counts its state rows per key group every 2 s): the point is where its keys divide in half
(key group 9 for these 50 keys, not the midpoint 8), shown in status.split with the state rows and the batch they
were counted at. While the children are on standby (their driver processes are frozen with SIGSTOP so that they
cannot become ready: the withdrawal must beat the hand-over, deterministically) the request is withdrawn with
``kubectl patch``. The operator moves the parent to AbortingSplit, deletes both children, stops the parent's pod,
runs it once with ``--abort-split`` and brings the shard back to Running; results stay exact, the children's
storage holds only their fencing epochs. Then, on skewed input (most rows in key groups 0 and 1), the shard is
split again with ``by: load`` (the Task counts rows per key group): the point follows the rows, not the midpoint,
and status.split shows it with the expected shares before the hand-over; the shard is deleted with ``kubectl
delete`` while its children catch up: the split finalizer keeps it until the split is done, the children take over,
and the parent goes. At no instant do two running pods own a key group outside a hand-over.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from spark_runtime.keygroups import KeyGroupRange, key_group
from spark_runtime.produce import append_events
from taskshard_operator.split_points import load_split_point
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    driver_pid,
    operator_crds,
    operator_process,
    shard_phases,
    task_manifest,
    wait_phases,
    wait_results,
    write_events,
)
from tests.cluster.test_operator_e2e import START, OverlapWatcher, assert_single_hand_over, status
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

PARENT = "ab-0-16"
KEYS = [f"k{i}" for i in range(50)]  # write_events' keys
STATE_POINT = load_split_point(
    KeyGroupRange(0, 16), {(g, g + 1): float(n) for g, n in Counter(key_group(k, 16) for k in KEYS).items()}
)
LOW, HIGH = f"ab-0-{STATE_POINT.at}", f"ab-{STATE_POINT.at}-16"
HOT = [f"k{i}" for i in range(400) if key_group(f"k{i}", 16) in (0, 1)][:10]
COLD = [f"k{i}" for i in range(400) if key_group(f"k{i}", 16) >= 2][:40]


def write_skewed(data, task: str, *, start: int, count: int) -> None:
    """Four of five events on keys of key groups 0 and 1, the rest spread over key groups 2 to 15."""
    keys = [HOT[i % len(HOT)] if i % 5 else COLD[(i // 5) % len(COLD)] for i in range(start, start + count)]
    journal = data / "journal" / task
    append_events(journal, 2, [{"key": k, "seq": i} for i, k in enumerate(keys, start)])


def events_of(kubectl, name: str) -> list[str]:
    items = get_json(kubectl, "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return [e["reason"] for e in items]


def test_a_withdrawn_split_is_undone_and_a_parent_deleted_mid_split_finishes_it(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    watcher = OverlapWatcher(kubectl, data)
    watcher.start()
    frozen: list[int] = []
    try:
        write_events(data, "ab", start=0, count=300)
        task = task_manifest("ab", data, max_key_groups=16)
        conf = task["spec"]["spark"]["conf"]
        conf["spark.taskshard.keyGroupMetrics"] = "true"  # the load map, for by: load
        conf["spark.taskshard.stateMapSeconds"] = "2"  # the state map, for by: state
        apply(kubectl, task)
        wait_phases(kubectl, {PARENT: "Running"}, START, op)
        wait_results(data, "ab", START)

        # Split by state once the operator saw a state map of the batch that completed the results.
        def state_map_of_last_batch() -> bool:
            live = status(kubectl, "taskshard", PARENT).get("live") or {}
            return live.get("stateMapBatch") is not None and live.get("stateMapBatch") == live.get("batchId")

        wait_for(state_map_of_last_batch, 120, "status.live.stateMapBatch at the last batch")
        batch = status(kubectl, "taskshard", PARENT)["live"]["stateMapBatch"]
        body = {"spec": {"split": {"requested": True, "by": "state"}}}
        kubectl("patch", "taskshard", PARENT, "--type=merge", "-p", json.dumps(body))
        wait_for(lambda: status(kubectl, "taskshard", PARENT).get("split"), 60, "status.split")
        chosen = status(kubectl, "taskshard", PARENT)["split"]
        assert STATE_POINT.at != 8 and chosen["at"] == STATE_POINT.at and chosen["by"] == "state", chosen
        assert chosen["stateRows"] == len(KEYS) and chosen["stateBatch"] == batch, chosen
        assert chosen["expectedShares"] == [round(s, 4) for s in STATE_POINT.shares], chosen

        # Freeze each child's driver as soon as it runs: they stay on standby, never ready.
        for child in (LOW, HIGH):
            frozen.append(wait_for(lambda c=child: driver_pid(kubectl, c), START, f"{child}'s driver running"))
            os.killpg(frozen[-1], signal.SIGSTOP)
        assert shard_phases(kubectl)[PARENT] == "Draining"
        write_events(data, "ab", start=300, count=100)  # the parent keeps processing and emitting

        # Withdraw: the children go, the parent's pod undoes the split in storage, the shard runs again.
        kubectl(
            "patch", "taskshard", PARENT, "--type=merge", "-p", json.dumps({"spec": {"split": {"requested": False}}})
        )
        wait_for(lambda: shard_phases(kubectl).get(PARENT) == "AbortingSplit", 60, "phase AbortingSplit")
        for pid in frozen:  # let them take their SIGTERM (a stop on standby)
            os.killpg(pid, signal.SIGCONT)
        frozen.clear()
        wait_for(lambda: not ({LOW, HIGH} & set(shard_phases(kubectl))), START, "both children deleted")
        wait_phases(kubectl, {PARENT: "Running"}, START, op)
        parent = status(kubectl, "taskshard", PARENT)
        assert "split" not in parent and not (parent.get("lineage") or {}).get("children"), parent
        progressing = next(c for c in parent["conditions"] if c["type"] == "Progressing")
        assert progressing["reason"] in ("SplitAborted", "Stable"), progressing
        meta = get_json(kubectl, "taskshard", PARENT)["metadata"]
        assert "taskshard.io/split" not in (meta.get("finalizers") or []), "the finalizer goes with the split"
        reasons = events_of(kubectl, PARENT)
        assert "SplitAborting" in reasons and "SplitAborted" in reasons, reasons
        shards = data / "state" / "ab" / "shards"
        for child in (LOW, HIGH):
            assert {f.name for f in (shards / child).iterdir()} == {"epochs"}, f"{child}: only its fence is left"
        assert not (shards / PARENT / "handover").exists() and not (shards / PARENT / "drained.json").exists()
        write_skewed(data, "ab", start=400, count=400)
        wait_results(data, "ab", START)
        scraped_after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        wait_for(
            lambda: (status(kubectl, "taskshard", PARENT).get("live") or {}).get("observedAt", "") > scraped_after,
            120,
            "a scrape of the resumed parent after the skewed input",
        )

        # Split again, by load, and delete the parent mid-split: the finalizer holds it until the children own it.
        body = {"spec": {"split": {"requested": True, "by": "load"}}}
        kubectl("patch", "taskshard", PARENT, "--type=merge", "-p", json.dumps(body))
        wait_for(lambda: shard_phases(kubectl).get(PARENT) == "Draining", 60, "phase Draining")
        chosen = status(kubectl, "taskshard", PARENT)["split"]
        assert chosen["by"] == "load" and 1 <= chosen["at"] <= 3, chosen
        assert chosen["windowRows"] > 0 and abs(chosen["expectedShares"][0] - 0.5) < 0.3, chosen
        low, high = f"ab-0-{chosen['at']}", f"ab-{chosen['at']}-16"
        kubectl("delete", "taskshard", PARENT, "--wait=false")
        assert get_json(kubectl, "taskshard", PARENT)["metadata"].get("deletionTimestamp")
        wait_phases(kubectl, {low: "Running", high: "Running"}, START, op)
        wait_for(lambda: PARENT not in shard_phases(kubectl), START, "the split parent deleted after its split")
        write_skewed(data, "ab", start=800, count=200)
        expected = wait_results(data, "ab", START)
        assert sum(expected.values()) == 1000
        assert_single_hand_over(data, "ab", PARENT, (low, high))
        assert watcher.samples > 0 and not watcher.violations, watcher.violations
    finally:
        for pid in frozen:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        watcher.stop()
