"""``kubectl scale task`` end to end (real control plane, kubectl, node agent, Spark pods): the Task's scale
subresource drives ``spec.shards``.

``test_kubectl_scale_splits_one_shard_at_a_time_and_refuses_to_scale_down``: a Task with one shard over 16 key
groups (the load map on) and a small journal input. ``kubectl scale task --replicas 3`` makes the operator split
twice, one split after the other (at no poll are two shards splitting; the second split is accepted only after the
first parent reached Split), each time the shard with the most input rows by load, into three Running shards that
tile [0, 16), with two ScalingUp events on the Task; per-key results stay exact and each hand-over is single. The
scale subresource reads back 3 replicas and the shard pods' selector (``status.selector``, which selects exactly
the driver pods). ``--replicas 1`` is refused: Scaled=False reason MergeUnavailable with the message, one
ScaleDownUnavailable event however many passes follow, and nothing else changes. ``--replicas 9999`` (beyond
maxKeyGroups) is refused by the API server naming spec.shards; ``--replicas 3`` again is Scaled=True.
"""

from __future__ import annotations

import json

import pytest

from spark_runtime.keygroups import KeyGroupRange, check_tiling
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    operator_crds,
    operator_process,
    running_pods,
    shard_phases,
    task_manifest,
    wait_phases,
    wait_results,
    write_events,
)
from tests.cluster.test_operator_e2e import START, OverlapWatcher, assert_single_hand_over, condition, status
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

TASK = "sc"
SPLIT_PHASES = {"SplitRequested", "Draining", "Drained", "ChildrenCreated", "AbortingSplit"}
SCALE_DOWN = (
    "spec.shards is 1 but the Task has 3 active shards: scaling down needs merging shards, which this version does "
    "not do yet; the Task keeps 3 shards"
)


def task_events(kubectl, reason: str) -> list[dict]:
    items = get_json(kubectl, "events", "--field-selector", f"involvedObject.kind=Task,involvedObject.name={TASK}")
    return [e for e in items["items"] if e["reason"] == reason]


def event_time(event: dict) -> str:
    return event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp") or ""


def task_passes(op) -> float:
    return op.metrics().get(("taskshard_operator_passes_total", (("kind", "task"), ("outcome", "ok"))), 0.0)


def active_shards(kubectl) -> dict[str, dict]:
    items = get_json(kubectl, "taskshards", "-l", f"taskshard.io/task={TASK},taskshard.io/active=true")["items"]
    return {i["metadata"]["name"]: i for i in items}


def test_kubectl_scale_splits_one_shard_at_a_time_and_refuses_to_scale_down(
    kubectl,
    namespace,
    operator_process,  # noqa: F811
    tmp_path,
):
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    watcher = OverlapWatcher(kubectl)
    watcher.start()
    try:
        write_events(data, TASK, start=0, count=300)
        task = task_manifest(TASK, data, max_key_groups=16, initial_shards=1)
        task["spec"]["spark"]["conf"]["spark.taskshard.keyGroupMetrics"] = "true"  # load maps: split by load
        apply(kubectl, task)
        wait_phases(kubectl, {f"{TASK}-0-16": "Running"}, START, op)
        wait_results(data, TASK, START)

        # Nothing asked yet: Scaled=True (spec.shards unset), and the selector names the shard pods.
        wait_for(
            lambda: condition(status(kubectl, "task", TASK), "Scaled").get("reason") == "NotRequested",
            60,
            "Scaled=True reason NotRequested",
        )
        selector = kubectl("get", "task", TASK, "-o", "jsonpath={.status.selector}").stdout
        assert selector == f"taskshard.io/task={TASK},taskshard.io/component=shard", selector

        # kubectl scale: two splits, one at a time, then three Running shards tiling [0, 16).
        kubectl("scale", "task", TASK, "--replicas", "3")
        assert get_json(kubectl, "task", TASK)["spec"]["shards"] == 3
        seen_splitting: list[list[str]] = []
        produced = [300]

        def three_running():
            write_events(data, TASK, start=produced[0], count=10)  # input keeps coming while the shards split
            produced[0] += 10
            phases = shard_phases(kubectl)
            seen_splitting.append(sorted(n for n, p in phases.items() if p in SPLIT_PHASES))
            active = {n: s for n, s in active_shards(kubectl).items()}
            ready = all(condition(s.get("status") or {}, "Ready").get("status") == "True" for s in active.values())
            return len(active) == 3 and all(phases.get(n) == "Running" for n in active) and ready and active

        active = wait_for(three_running, 3 * START, "three Running, emitting shards after kubectl scale", interval=1.0)
        assert all(len(s) <= 1 for s in seen_splitting), f"two shards split at once: {seen_splitting}"
        ranges = [
            KeyGroupRange(s["spec"]["keyGroups"]["start"], s["spec"]["keyGroups"]["end"]) for s in active.values()
        ]
        check_tiling(ranges, 16)  # raises unless they tile [0, 16) with no gap and no overlap
        shards = {i["metadata"]["name"]: i for i in get_json(kubectl, "taskshards")["items"]}
        parents = sorted(
            (s for s in shards.values() if (s.get("status") or {}).get("phase") == "Split"),
            key=lambda s: s["status"]["split"]["acceptedTime"],
        )
        assert [p["metadata"]["name"] for p in parents][0] == f"{TASK}-0-16" and len(parents) == 2, list(shards)
        first, second = parents
        first_done = condition(first["status"], "Splitting")["lastTransitionTime"]  # False since it reached Split
        assert second["status"]["split"]["acceptedTime"] >= first_done, "the second split began before the first ended"
        assert second["metadata"]["name"] in first["status"]["lineage"]["children"], "the second split is a child's"
        scaling_up = sorted(task_events(kubectl, "ScalingUp"), key=event_time)
        assert len(scaling_up) == 2, scaling_up
        assert [p["metadata"]["name"] for p in parents] == [
            next(n for n in shards if f"TaskShard {n} " in e["message"]) for e in scaling_up
        ], [e["message"] for e in scaling_up]
        assert all("spec.shards 3 > " in e["message"] for e in scaling_up)
        assert event_time(scaling_up[1]) >= first_done
        # The load maps decide: the shard with the most input rows, split where its rows divide in half (the
        # second choice waits for the first scrape of the children that just took over).
        assert all("has the most input rows" in e["message"] and "by load" in e["message"] for e in scaling_up)
        assert [p["status"]["split"]["by"] for p in parents] == ["load", "load"], [p["status"] for p in parents]

        # Results stay exact after both hand-overs.
        write_events(data, TASK, start=produced[0], count=200)
        expected = wait_results(data, TASK, START)
        assert sum(expected.values()) == produced[0] + 200
        output = data / "output" / TASK
        for parent in parents:
            # A child split again may have handed over before it emitted anything: nothing of it to check then.
            children = [
                c
                for c in parent["status"]["lineage"]["children"]
                if c in active or any((output / f"shard={c}").glob("**/batch-*.jsonl"))
            ]
            assert_single_hand_over(data, TASK, parent["metadata"]["name"], children)

        # The scale subresource reads back; the selector selects exactly the active shards' driver pods.
        wait_for(
            lambda: condition(status(kubectl, "task", TASK), "Scaled").get("status") == "True",
            60,
            "Scaled=True with three shards",
        )
        scale = json.loads(
            kubectl("get", "--raw", f"/apis/taskshard.io/v1alpha1/namespaces/{namespace}/tasks/{TASK}/scale").stdout
        )
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3, scale
        assert scale["status"]["selector"] == selector
        pods = kubectl("get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert sorted(pods) == sorted(f"{n}-driver" for n in active), pods
        table = kubectl("get", "task", TASK).stdout.splitlines()
        assert table[0].split()[:3] == ["NAME", "SHARDS", "DESIRED"] and table[1].split()[1:3] == ["3", "3"], table

        # Scale down: refused with the reason, once; nothing changes over the following passes.
        before = (shard_phases(kubectl), sorted(running_pods(kubectl)))
        kubectl("scale", "task", TASK, "--replicas", "1")

        def refused():
            scaled = condition(status(kubectl, "task", TASK), "Scaled")
            return scaled.get("reason") == "MergeUnavailable" and scaled

        scaled = wait_for(refused, 60, "Scaled=False reason MergeUnavailable")
        assert scaled["status"] == "False" and scaled["message"] == SCALE_DOWN, scaled
        assert status(kubectl, "task", TASK)["scaling"]["decision"] == "RefuseScaleDown"
        passes = task_passes(op)
        wait_for(lambda: task_passes(op) >= passes + 3, 60, "three more Task passes (resync every 2 s)")
        assert (shard_phases(kubectl), sorted(running_pods(kubectl))) == before
        assert not any((s["spec"].get("split") or {}).get("requested") for s in active_shards(kubectl).values())
        warnings = task_events(kubectl, "ScaleDownUnavailable")
        assert len(warnings) == 1 and warnings[0]["message"] == SCALE_DOWN and warnings[0]["type"] == "Warning"
        assert warnings[0].get("count", 1) == 1, warnings
        assert status(kubectl, "task", TASK)["shards"] == 3

        # Beyond maxKeyGroups: the API server refuses the scale, naming spec.shards.
        bad = kubectl("scale", "task", TASK, "--replicas", "9999", check=False)
        assert bad.returncode != 0, bad.stdout
        assert "spec.shards: 9999 must be at most spec.maxKeyGroups (16)" in bad.stderr, bad.stderr
        assert get_json(kubectl, "task", TASK)["spec"]["shards"] == 1

        # Back to the active count: scaled.
        kubectl("scale", "task", TASK, "--replicas", "3")
        wait_for(
            lambda: condition(status(kubectl, "task", TASK), "Scaled").get("reason") == "DesiredShards",
            60,
            "Scaled=True reason DesiredShards",
        )
        assert len(task_events(kubectl, "ScalingUp")) == 2 and shard_phases(kubectl) == before[0]
    finally:
        watcher.stop()
    assert watcher.samples > 10 and not watcher.violations, watcher.violations
