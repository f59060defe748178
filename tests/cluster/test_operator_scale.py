"""``kubectl scale task`` and ``spec.autoscale`` end to end (real control plane, kubectl, node agent, Spark pods):
the Task's scale subresource drives ``spec.shards``, the autoscaler its own count.

``test_kubectl_scale_splits_the_busiest_shard_and_the_autoscaler_merges_to_max_shards``: a Task with two initial
shards over 16 key groups (the load map on) and a small journal input. ``kubectl scale task --replicas 3`` makes
the operator split the shard with the most input rows, by load, into three Running shards that tile [0, 16),
with a ScalingUp event on the Task; per-key results stay exact and the hand-over is single. The scale subresource
reads back 3 replicas and the shard pods' selector (``status.selector``, which selects exactly the driver pods).
``--replicas 9999`` (beyond maxKeyGroups) is refused by the API server naming spec.shards. Then ``spec.shards``
gives way to ``spec.autoscale: {minShards: 2, maxShards: 2}``: the autoscaler brings the count within its bounds
(AboveMaxShards, an AutoscalingDown event), which merges the pair of adjacent shards with the fewest input rows
(a ScalingDown event): both parents reach Merged, the merged shard (in a name family of its own) runs over their
union, results stay exact and the hand-over is single, although the operator is killed right after it writes the
merge's first Merging phase and started again; ``status.autoscale`` then holds at minShards, reading the
shards' ``status.live.lagSeconds``. A ``kubectl scale`` on the autoscaled Task is refused naming both fields.
(Two consecutive splits, one at a time, and 3 -> 1 by two merges: the unit tier's in-memory runs; growing on lag:
the unit tier's policy tests and in-memory run. Here one split and one merge keep the test's time in budget.)
"""

from __future__ import annotations

import json

import pytest

from spark_runtime.keygroups import KeyGroupRange, check_tiling
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    operator_crds,
    operator_process,
    shard_phases,
    task_manifest,
    wait_phases,
    wait_results,
    write_events,
)
from tests.cluster.test_operator_e2e import (
    START,
    OverlapWatcher,
    assert_single_hand_over,
    assert_single_merge,
    condition,
    status,
)
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

TASK = "sc"
SPLIT_PHASES = {"SplitRequested", "Draining", "Drained", "ChildrenCreated", "AbortingSplit"}


def task_events(kubectl, reason: str) -> list[dict]:
    items = get_json(kubectl, "events", "--field-selector", f"involvedObject.kind=Task,involvedObject.name={TASK}")
    return [e for e in items["items"] if e["reason"] == reason]


def active_shards(kubectl) -> dict[str, dict]:
    items = get_json(kubectl, "taskshards", "-l", f"taskshard.io/task={TASK},taskshard.io/active=true")["items"]
    return {i["metadata"]["name"]: i for i in items}


def test_kubectl_scale_splits_the_busiest_shard_and_the_autoscaler_merges_to_max_shards(
    kubectl,
    namespace,
    operator_process,  # noqa: F811
    tmp_path,
):
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    watcher = OverlapWatcher(kubectl, data)
    watcher.start()
    try:
        write_events(data, TASK, start=0, count=300)
        task = task_manifest(TASK, data, max_key_groups=16, initial_shards=2)
        task["spec"]["spark"]["conf"]["spark.taskshard.keyGroupMetrics"] = "true"  # load maps: split by load
        # The merged shard skips its standby rehearsal (a warm-up only: the merge is exact either way); on 2 cores
        # with three shards running it takes minutes, which the test's time budget does not have.
        task["spec"]["spark"]["conf"]["spark.taskshard.rehearse"] = "false"
        apply(kubectl, task)
        wait_phases(kubectl, {f"{TASK}-0-8": "Running", f"{TASK}-8-16": "Running"}, START, op)
        wait_results(data, TASK, START)

        # Nothing asked yet: Scaled=True (spec.shards unset), and the selector names the shard pods.
        wait_for(
            lambda: condition(status(kubectl, "task", TASK), "Scaled").get("reason") == "NotRequested",
            60,
            "Scaled=True reason NotRequested",
        )
        selector = kubectl("get", "task", TASK, "-o", "jsonpath={.status.selector}").stdout
        assert selector == f"taskshard.io/task={TASK},taskshard.io/component=shard", selector

        # kubectl scale: one split, then three Running shards tiling [0, 16).
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
        assert len(parents) == 1, list(shards)
        (scaling_up,) = task_events(kubectl, "ScalingUp")
        assert f"TaskShard {parents[0]['metadata']['name']} " in scaling_up["message"], scaling_up["message"]
        assert "spec.shards 3 > 2 active shards" in scaling_up["message"]
        # The load maps decide: the shard with the most input rows, split where its rows divide in half.
        assert "has the most input rows" in scaling_up["message"] and "by load" in scaling_up["message"]
        assert parents[0]["status"]["split"]["by"] == "load", parents[0]["status"]

        # Results stay exact after both hand-overs.
        write_events(data, TASK, start=produced[0], count=200)
        expected = wait_results(data, TASK, START)
        assert sum(expected.values()) == produced[0] + 200
        produced[0] += 200
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

        # Beyond maxKeyGroups: the API server refuses the scale, naming spec.shards.
        bad = kubectl("scale", "task", TASK, "--replicas", "9999", check=False)
        assert bad.returncode != 0, bad.stdout
        assert "spec.shards: 9999 must be at most spec.maxKeyGroups (16)" in bad.stderr, bad.stderr
        assert get_json(kubectl, "task", TASK)["spec"]["shards"] == 3

        # The autoscaler takes over with maxShards 2: down by one, the adjacent pair with the fewest input rows
        # merges; results stay exact.
        autoscale = {"minShards": 2, "maxShards": 2, "targetLagSeconds": 600, "stabilizationSeconds": 5}
        patch = json.dumps({"spec": {"shards": None, "autoscale": autoscale}})
        # The operator dies right after it writes each of the merge's phases in turn: MergeRequested (the claim on
        # the right shard patched, nothing created), Merging (the merged shard created) and Merged (the first
        # parent done), and starts again each time: the merge goes on from its recorded step, nothing is created
        # twice. (Every other step, after every single API write: the unit tier's simulated world.)
        op.kill()
        op.start(crash_after_phase="MergeRequested")
        kubectl("patch", "task", TASK, "--type", "merge", "-p", patch)
        for phase, then in (("MergeRequested", "Merging"), ("Merging", "Merged"), ("Merged", None)):
            code = op.wait_exit(timeout=2 * START)
            assert code == 137, f"the operator should have died after writing {phase}; exit code {code}"
            assert phase in shard_phases(kubectl).values(), shard_phases(kubectl)
            op.start(crash_after_phase=then)

        def two_running():
            write_events(data, TASK, start=produced[0], count=10)  # input keeps coming while the shards merge
            produced[0] += 10
            now = {n: s for n, s in active_shards(kubectl).items()}
            phases = shard_phases(kubectl)
            ready = all(condition(s.get("status") or {}, "Ready").get("status") == "True" for s in now.values())
            return len(now) == 2 and all(phases.get(n) == "Running" for n in now) and ready and now

        after = wait_for(two_running, 2 * START, "two Running, emitting shards after the autoscaler's merge")
        merged = next(s for s in after.values() if s["spec"].get("mergeFrom"))
        pair = [p["parent"] for p in merged["spec"]["mergeFrom"]]
        assert set(pair) <= set(active) and merged["metadata"]["labels"].get("taskshard.io/family"), merged
        check_tiling(
            [KeyGroupRange(s["spec"]["keyGroups"]["start"], s["spec"]["keyGroups"]["end"]) for s in after.values()], 16
        )
        shards = {i["metadata"]["name"]: i for i in get_json(kubectl, "taskshards")["items"]}
        for parent in pair:
            assert shards[parent]["status"]["phase"] == "Merged" and shards[parent]["status"]["finalCheckpoint"]
            assert shards[parent]["status"]["merge"]["into"] == merged["metadata"]["name"]
        assert merged["status"]["lineage"]["parents"] == pair
        (autoscaling,) = task_events(kubectl, "AutoscalingDown")
        assert "3 shards is outside [minShards 2, maxShards 2]: wants 2" in autoscaling["message"], autoscaling
        scaling_down = task_events(kubectl, "ScalingDown")
        assert len(scaling_down) == 1, scaling_down
        assert "status.autoscale.desiredShards 2 < 3 active shards" in scaling_down[0]["message"], scaling_down
        assert "have the fewest input rows together" in scaling_down[0]["message"], scaling_down[0]["message"]
        write_events(data, TASK, start=produced[0], count=100)
        expected = wait_results(data, TASK, START)
        assert sum(expected.values()) == produced[0] + 100
        assert_single_merge(data, TASK, pair, merged["metadata"]["name"])
        wait_for(
            lambda: condition(status(kubectl, "task", TASK), "Scaled").get("reason") == "DesiredShards",
            60,
            "Scaled=True reason DesiredShards with two shards",
        )
        assert status(kubectl, "task", TASK)["shards"] == 2

        # The autoscaler holds at minShards, reading the shards' lag in seconds (a small input: a cold Task).
        def held_at_min():
            shown = status(kubectl, "task", TASK).get("autoscale") or {}
            return shown.get("reason") == "AtMinShards" and shown

        shown = wait_for(held_at_min, 120, "status.autoscale reason AtMinShards")
        assert shown["desiredShards"] == 2 and shown["worstLagSeconds"] <= 150, shown
        lives = [(s.get("status") or {}).get("live") or {} for s in active_shards(kubectl).values()]
        assert all(live.get("lagSeconds") is not None for live in lives), lives
        # An autoscaled Task refuses kubectl scale, naming both fields; nothing changes.
        bad = kubectl("scale", "task", TASK, "--replicas", "3", check=False)
        assert bad.returncode != 0 and "spec.shards and spec.autoscale exclude each other" in bad.stderr, bad.stderr
        assert "shards" not in get_json(kubectl, "task", TASK)["spec"]
        assert len(task_events(kubectl, "ScalingUp")) == 1 and len(task_events(kubectl, "ScalingDown")) == 1
        families = [s for s in get_json(kubectl, "taskshards")["items"] if s["spec"].get("mergeFrom")]
        assert len(families) == 1, [s["metadata"]["name"] for s in families]  # one merged shard, never two
    finally:
        watcher.stop()
    assert watcher.samples > 10 and not watcher.violations, watcher.violations
