"""Scaling a Task to ``spec.shards`` (the scale subresource): the pure chooser (``scaling.decide_scaling``) over
recorded shard views and loads, the Task pass acting on it (one split request, its event, ``status.scaling`` and
the Scaled condition, written once), the model and CRD rule on ``spec.shards``, the template hash that ignores it,
and an in-memory run from 1 to 3 shards and back to 1 by merges."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from pydantic import ValidationError

from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.live import LiveStats
from taskshard_operator import builders, naming
from taskshard_operator import status as st
from taskshard_operator.act import Event, Patch
from taskshard_operator.cache import parse_task
from taskshard_operator.kube import Conflict
from taskshard_operator.live import Scraped
from taskshard_operator.models.crd import build_crds
from taskshard_operator.models.shard import ShardPhase, SplitBy
from taskshard_operator.models.task import ScalingDecision, TaskSpec, shards_over_limit_message
from taskshard_operator.planner import ShardView, owners
from taskshard_operator.reconcile_task import decide_task, reconcile_task
from taskshard_operator.scaling import (
    LOAD_GRACE_SECONDS,
    MERGING_SHARDS,
    MergeAsk,
    ShardLoad,
    SplitAsk,
    decide_scaling,
    rows_in_range,
    shard_load,
    split_ask,
)
from taskshard_operator.views import shard_views

from .fake_cluster import converge, merge_patch, new_world
from .fake_observed import TASK, World, actions_of, add_shard, make_pod, running
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit


def view(start: int, end: int, phase: str = "Running", **kwargs: Any) -> ShardView:
    return ShardView(f"t-{start}-{end}", KeyGroupRange(start, end), ShardPhase(phase), **kwargs)


THREE = [view(0, 8), view(8, 12), view(12, 16)]
"""Three Running shards tiling [0, 16)."""


def decide(desired, views=THREE, *, loads=None, asks=None, ready=None, blocked=None, awaiting_load=(), merges=None):
    ready = {v.name for v in views} if ready is None else ready
    return decide_scaling(
        desired,
        views,
        ready=ready,
        loads=loads or {},
        asks=asks or {},
        blocked=blocked,
        awaiting_load=awaiting_load,
        merges=merges or {},
    )


# ---------------------------------------------------------------- the pure chooser


def test_unset_shards_is_nothing_to_do():
    d = decide(None)
    assert (d.decision, d.reason, d.scaled, d.shard) == (ScalingDecision.NO_CHANGE, "NotRequested", True, None)


def test_as_many_as_wanted_is_nothing_to_do():
    d = decide(3)
    assert (d.decision, d.reason, d.scaled) == (ScalingDecision.NO_CHANGE, "DesiredShards", True)
    assert d.message == "3 active shards, as spec.shards asks"


def test_scale_down_merges_the_coldest_adjacent_pair_one_at_a_time():
    loads = {"t-0-8": ShardLoad(100, 300), "t-8-12": ShardLoad(50, 300), "t-12-16": ShardLoad(12_345, 300)}
    d = decide(2, loads=loads)
    assert (d.decision, d.reason, d.shard, d.merge_with, d.scaled) == (
        ScalingDecision.MERGE, MERGING_SHARDS, "t-0-8", "t-8-12", False,
    )  # fmt: skip
    assert d.message == (
        "spec.shards 2 < 3 active shards; t-0-8 and t-8-12 have the fewest input rows together (150); merging "
        "t-0-8 [0, 8) with t-8-12 [8, 12)"
    )
    hot_left = {**loads, "t-0-8": ShardLoad(99_999, 300)}
    one = decide(1, loads=hot_left)
    assert (one.shard, one.merge_with) == ("t-8-12", "t-12-16")
    assert one.message.endswith("; 1 more merge after this one, one at a time")
    # Without load data for every pair: the narrowest pair, then key-group order.
    d = decide(2)
    assert (d.shard, d.merge_with) == ("t-8-12", "t-12-16") and "no load data" in d.message
    # One hand-over at a time: a split or a merge in progress, or a request its pass has not taken, waits.
    splitting = [view(0, 8, "Draining"), view(8, 12), view(12, 16)]
    assert decide(2, splitting).decision == ScalingDecision.WAIT
    merging = [view(0, 8, "Merging"), view(8, 12, "Merging"), view(12, 16)]
    waiting = decide(2, merging)
    assert (waiting.decision, waiting.reason) == (ScalingDecision.WAIT, "WaitingForMerge")
    assert "the merge of t-0-8 (Merging), t-8-12 (Merging) is in progress" in waiting.message
    pending = decide(2, merges={"t-8-12": MergeAsk("t-12-16", pending=True)})
    assert pending.decision == ScalingDecision.WAIT and "has a merge request (spec.merge)" in pending.message
    # A pair whose merge was refused is passed over for the next one; every pair refused: stuck, never pinned.
    refused = decide(2, merges={"t-8-12": MergeAsk("t-12-16", refused=True, why="t-12-16 is busy")})
    assert (refused.decision, refused.shard, refused.merge_with) == (ScalingDecision.MERGE, "t-0-8", "t-8-12")
    assert "of those not refused (t-8-12 with t-12-16 was refused)" in refused.message
    both = {
        "t-8-12": MergeAsk("t-12-16", refused=True, why="t-12-16 is busy"),
        "t-0-8": MergeAsk("t-8-12", refused=True, why="executors differ"),
    }
    stuck = decide(2, merges=both)
    assert (stuck.decision, stuck.reason, stuck.shard) == (ScalingDecision.WAIT, "ScalingStuck", None)
    assert stuck.message.endswith(
        "stuck: every adjacent pair's merge was refused (see their MergeRejected conditions): t-0-8 with t-8-12: "
        "executors differ; t-8-12 with t-12-16: t-12-16 is busy"
    )
    not_ready = decide(2, ready={"t-0-8"})
    assert not_ready.decision == ScalingDecision.WAIT and "not emitting yet" in not_ready.message


def test_the_shard_with_the_most_input_rows_splits_by_load():
    loads = {"t-0-8": ShardLoad(100, 300), "t-8-12": ShardLoad(12_345, 300), "t-12-16": ShardLoad(10, 300)}
    d = decide(4, loads=loads)
    assert (d.decision, d.reason, d.shard, d.by, d.scaled) == (
        ScalingDecision.SPLIT, "SplittingShard", "t-8-12", SplitBy.LOAD, False,
    )  # fmt: skip
    assert d.message == (
        "spec.shards 4 > 3 active shards; TaskShard t-8-12 has the most input rows (12,345 in the last 300 s); "
        "splitting it by load (where its input rows divide in half)"
    )
    five = decide(5, loads=loads)
    assert five.shard == "t-8-12" and five.message.endswith("; 1 more split after this one, one at a time")


def test_single_key_group_shards_are_never_chosen():
    views = [view(0, 1), view(1, 2), view(2, 16)]
    loads = {"t-0-1": ShardLoad(9_000, 300), "t-1-2": ShardLoad(8_000, 300), "t-2-16": ShardLoad(5, 300)}
    d = decide(4, views, loads=loads)
    assert d.shard == "t-2-16" and d.by == SplitBy.LOAD
    ones = [view(i, i + 1) for i in range(4)]
    d = decide_scaling(5, ones, ready={v.name for v in ones}, loads={}, asks={})  # a stray desired > 4 groups
    assert d.decision == ScalingDecision.WAIT and "no active shard has two or more key groups" in d.message


def test_without_load_data_the_widest_range_splits_at_the_midpoint_then_key_group_order():
    views = [view(0, 4), view(4, 12), view(12, 16)]
    d = decide(4, views)
    assert (d.shard, d.by) == ("t-4-12", SplitBy.MIDPOINT)
    assert "no load data" in d.message and "TaskShard t-4-12 [4, 12) is the widest" in d.message
    assert d.message.endswith("splitting it at the midpoint")
    tie = decide(3, [view(0, 8), view(8, 16)])
    assert (tie.shard, tie.by) == ("t-0-8", SplitBy.MIDPOINT), "equal widths: key-group order"
    idle = decide(4, loads={"t-0-8": ShardLoad(0, 300), "t-8-12": ShardLoad(0, 300)})
    assert (idle.shard, idle.by) == ("t-0-8", SplitBy.MIDPOINT) and "no input rows in the load window" in idle.message
    fresh = decide(4, loads={"t-12-16": ShardLoad(40, 0)})
    assert fresh.shard == "t-12-16" and "(40 since its pod started)" in fresh.message


@pytest.mark.parametrize("phase", [p.value for p in ShardPhase if p.splitting])
def test_no_split_starts_while_any_shard_splits(phase):
    views = [view(0, 8, phase), view(8, 16)]
    if phase == "ChildrenCreated":  # the parent handed over: its children own the halves
        views = [view(0, 8, phase), view(0, 4, "Pending", parent="t-0-8"), view(4, 8, "Pending", parent="t-0-8")]
        views.append(view(8, 16))
    d = decide(5, views, ready={"t-8-16"})
    assert (d.decision, d.reason, d.shard, d.scaled) == (ScalingDecision.WAIT, "WaitingForSplit", None, False)
    assert f"t-0-8 ({phase})" in d.message and "one hand-over at a time" in d.message


@pytest.mark.parametrize("phase", ["Pending", "Failed", "Suspended"])
def test_no_split_starts_while_an_active_shard_is_not_running(phase):
    d = decide(4, [view(0, 8), view(8, 12, phase), view(12, 16)], loads={"t-0-8": ShardLoad(99, 300)})
    assert d.decision == ScalingDecision.WAIT and f"t-8-12 ({phase}) not Running yet" in d.message


def test_no_split_starts_while_a_child_runs_but_does_not_emit_yet():
    """A split child is Running as soon as its pod runs, but emits only once it caught up with its parent's
    final positions: until then it is finishing its hand-over."""
    d = decide(4, ready={"t-0-8", "t-12-16"})
    assert d.decision == ScalingDecision.WAIT and "t-8-12 (Running) running but not emitting yet" in d.message


def test_a_split_request_not_taken_yet_is_not_made_again():
    asks = {"t-8-12": SplitAsk({"requested": True, "by": "load"}, pending=True)}
    d = decide(4, asks=asks, loads={"t-8-12": ShardLoad(500, 300)})
    assert d.decision == ScalingDecision.WAIT and d.shard is None
    assert "t-8-12 (Running) has a split request (spec.split) its pass has not taken yet" in d.message


def test_a_refused_split_by_load_is_asked_again_at_the_midpoint_but_never_repeated():
    loads = {"t-8-12": ShardLoad(500, 300)}
    refused_load = {"t-8-12": SplitAsk({"requested": True, "by": "load"}, refused=True)}
    d = decide(4, asks=refused_load, loads=loads)
    assert (d.decision, d.shard, d.by) == (ScalingDecision.SPLIT, "t-8-12", SplitBy.MIDPOINT)
    assert "(its last split request was refused)" in d.message
    refused_midpoint = {"t-8-12": SplitAsk({"requested": True, "by": "midpoint"}, refused=True, why="no room")}
    again = decide(4, asks=refused_midpoint, loads=loads)
    assert (again.decision, again.shard) == (ScalingDecision.SPLIT, "t-0-8"), "the next candidate"
    assert "of those not refused (t-8-12 refused this split)" in again.message
    every = {
        **refused_midpoint,
        "t-0-8": SplitAsk({"requested": True, "by": "midpoint"}, refused=True),
        "t-12-16": SplitAsk({"requested": True, "by": "midpoint"}, refused=True, why="too small"),
    }
    stuck = decide(4, asks=every, loads=loads)
    assert (stuck.decision, stuck.reason) == (ScalingDecision.WAIT, "ScalingStuck")
    assert "t-8-12: no room; t-0-8: refused; t-12-16: too small" in stuck.message


def test_a_new_shard_s_first_load_map_is_awaited_when_the_task_counts_them():
    loads = {"t-0-8": ShardLoad(100, 300)}
    d = decide(4, loads=loads, awaiting_load={"t-8-12"})
    assert d.decision == ScalingDecision.WAIT and "the first load map of t-8-12 (Running)" in d.message
    assert decide(4, loads=loads, awaiting_load={"t-0-8"}).decision == ScalingDecision.SPLIT, "it has one already"


def test_a_blocked_task_waits_with_the_reason():
    d = decide(4, blocked="the Task is suspended (spec.suspend: true)")
    assert d.decision == ScalingDecision.WAIT
    assert d.message == "spec.shards 4 > 3 active shards; waiting: the Task is suspended (spec.suspend: true)"


def test_the_load_of_a_shard_is_its_current_pods_rows_in_its_range():
    r = KeyGroupRange(8, 16)
    assert rows_in_range(r, {(8, 12): 30.0, (12, 16): 10.0, (0, 8): 999.0}) == 40.0
    assert rows_in_range(r, {(0, 16): 160.0}) == 80.0, "a wider bucket counts in proportion"
    stats = LiveStats(41, None, 20.0, 0, "bytes", 10, 0, True, key_group_rows={"8-12": 30.0})
    scraped = Scraped(stats, "t", "10.0.0.2", load={(8, 12): 30.0}, load_seconds=120)
    assert shard_load(r, scraped, "10.0.0.2") == ShardLoad(30.0, 120)
    assert shard_load(r, scraped, "10.0.0.3") is None, "a scrape of the pod this one replaced"
    off = Scraped(LiveStats(41, None, 20.0, 0, "bytes", 10, 0, True), "t", "10.0.0.2")
    assert shard_load(r, off, "10.0.0.2") is None and shard_load(r, None, None) is None


def test_a_split_ask_reads_the_generation_and_the_rejection():
    shard = {"metadata": {"generation": 3}, "spec": {"split": {"requested": True}}, "status": {"observedGeneration": 2}}
    assert split_ask(shard).pending
    shard["status"]["observedGeneration"] = 3
    assert not split_ask(shard).pending and not split_ask(shard).refused
    shard["status"]["conditions"] = [st.condition(st.SPLIT_REJECTED, True, "InvalidSplitRequest", "no")]
    assert split_ask(shard).refused
    assert split_ask({"metadata": {}, "spec": {}}) == SplitAsk(None)


# ---------------------------------------------------------------- the Task pass


def scaled_world(
    shards: int | None, ranges=((0, 8), (8, 16)), rows: dict[str, float] | None = None, *, load_maps: bool = False
) -> World:
    """Running, emitting shards with pods, made by earlier splits (and, for ``rows``, a load map over the last
    300 s)."""
    spec = copy.deepcopy(SPEC)
    if shards is not None:
        spec["shards"] = shards
    if load_maps:
        spec["spark"]["conf"] = {"spark.taskshard.keyGroupMetrics": "true"}
    world = World(spec)
    budget = {"name": naming.disruption_budget_name(TASK), "minAvailable": len(ranges) - 1}  # set by earlier passes
    world.tasks[TASK]["status"] = {"phase": "Running", "disruptionBudget": budget}
    template = parse_task(world.tasks[TASK]).template_hash
    for i, (start, end) in enumerate(ranges):
        name = f"t-{start}-{end}"
        ready = [st.condition(st.READY, True, "Emitting", "emits")]
        # split children of an earlier split (restoreFrom set): the Task creates no initial shard any more
        add_shard(world, name, phase="Running", status={"conditions": ready}, restore_from="t-0-16", template=template)
        pod = make_pod(name, phase="Running", state=running(), template=template)
        pod["status"]["podIP"] = f"10.0.0.{i + 2}"
        world.pods[name] = pod
        if rows and name in rows:
            stats = LiveStats(41, None, 20.0, 0, "bytes", 10, 0, True, key_group_rows={f"{start}-{end}": rows[name]})
            world.scrapes[name] = Scraped(
                stats, "t", f"10.0.0.{i + 2}", load={(start, end): rows[name]}, load_seconds=300
            )
    return world


def task_pass(world: World):
    before = world.snapshot()
    decision = decide_task(world, NS, TASK)
    assert decision is not None and world.snapshot() == before and world.calls == []
    return decision


def scaled_condition(status: dict) -> dict:
    cond = st.get_condition(status.get("conditions"), st.SCALED)
    assert cond is not None
    return cond


def test_the_task_pass_asks_the_hottest_shard_to_split_once():
    world = scaled_world(3, rows={"t-0-8": 120.0, "t-8-16": 12_345.0})
    decision = task_pass(world)
    (patch,) = actions_of(decision, Patch)
    assert decision.actions == [patch], "exactly one action: the split request"
    assert (patch.plural, patch.name) == (naming.SHARD_PLURAL, "t-8-16")
    assert patch.patch == {"spec": {"split": {"requested": True, "by": "load"}}}
    message = (
        "spec.shards 3 > 2 active shards; TaskShard t-8-16 has the most input rows (12,345 in the last 300 s); "
        "splitting it by load (where its input rows divide in half)"
    )
    assert patch.announce == Event("Normal", "ScalingUp", message), "posted as soon as the patch is made"
    assert decision.events == []
    scaling = decision.status["scaling"]
    assert {k: v for k, v in scaling.items() if k != "lastTransitionTime"} == {
        "desiredShards": 3, "activeShards": 2, "decision": "Split", "reason": "SplittingShard",
        "message": message, "shard": "t-8-16", "by": "load",
    }  # fmt: skip
    assert scaling["lastTransitionTime"].endswith("Z")
    cond = scaled_condition(decision.status)
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "SplittingShard", message)
    assert (
        decision.status["selector"] == naming.shard_selector(TASK) == "taskshard.io/task=t,taskshard.io/component=shard"
    )

    # The next pass sees the request (a new generation its shard's pass has not taken yet): no second patch.
    merge_patch(world.tasks[TASK]["status"], decision.status)
    world.shards["t-8-16"]["spec"]["split"] = patch.patch["spec"]["split"]
    world.shards["t-8-16"]["metadata"]["generation"] = 2
    again = task_pass(world)
    assert actions_of(again, Patch) == [] and again.events == []
    assert again.status["scaling"]["decision"] == "Wait" and again.status["scaling"]["reason"] == "WaitingForSplit"
    assert "shard" not in again.status["scaling"] or again.status["scaling"]["shard"] is None
    assert "t-8-16 (Running) has a split request" in again.status["scaling"]["message"]
    # Once accepted the shard is SplitRequested: still one split at a time, nothing else asked.
    merge_patch(world.tasks[TASK]["status"], again.status)
    world.shards["t-8-16"]["status"].update(phase="SplitRequested", observedGeneration=2)
    accepted = task_pass(world)
    assert actions_of(accepted, Patch) == [] and "ScalingUp" not in [e.reason for e in accepted.events]
    assert "the split of t-8-16 (SplitRequested) is in progress" in accepted.status["scaling"]["message"]


def test_an_unchanged_decision_writes_no_status():
    world = scaled_world(2)
    first = task_pass(world)
    assert first.actions == [] and first.status["scaling"]["decision"] == "NoChange"
    assert scaled_condition(first.status)["status"] == "True"
    merge_patch(world.tasks[TASK]["status"], first.status)
    assert task_pass(world).status == {}, "nothing changed: no status write"
    unset = scaled_world(None)
    first = task_pass(unset)
    assert "scaling" not in first.status and scaled_condition(first.status)["reason"] == "NotRequested"
    merge_patch(unset.tasks[TASK]["status"], first.status)
    assert task_pass(unset).status == {}


def test_a_scale_down_asks_the_left_shard_to_merge():
    world = scaled_world(2, ranges=((0, 4), (4, 8), (8, 16)))
    decision = task_pass(world)
    assert actions_of(decision, Patch) == [
        Patch(
            naming.SHARD_PLURAL,
            "t-0-4",
            {"spec": {"merge": {"with": "t-4-8"}}},
            announce=Event("Normal", "ScalingDown", decision.status["scaling"]["message"]),
        )
    ]
    scaling_status = decision.status["scaling"]
    assert (scaling_status["decision"], scaling_status["shard"], scaling_status["mergeWith"]) == (
        "Merge", "t-0-4", "t-4-8",
    )  # fmt: skip
    cond = scaled_condition(decision.status)
    assert (cond["status"], cond["reason"]) == ("False", "MergingShards")


def test_a_left_over_split_point_is_removed_from_the_request():
    world = scaled_world(3)
    world.shards["t-0-8"]["spec"]["split"] = {"requested": False, "at": 3}  # a withdrawn request by hand
    (patch,) = actions_of(task_pass(world), Patch)
    assert patch.name == "t-0-8" and patch.patch == {
        "spec": {"split": {"requested": True, "by": "midpoint", "at": None}}
    }


def test_with_load_maps_on_a_shard_that_just_started_emitting_is_measured_first():
    """The Task counts load maps: a shard that took over moments ago and was not scraped yet is waited for (a pass
    is scheduled for when the grace ends); one emitting for longer without a load map is split by width."""
    world = scaled_world(3, rows={"t-0-8": 50.0}, load_maps=True)
    just_now = st.condition(st.READY, True, "Emitting", "emits")  # lastTransitionTime: now
    world.shards["t-8-16"]["status"]["conditions"] = [just_now]
    decision = task_pass(world)
    assert actions_of(decision, Patch) == [] and "the first load map of t-8-16" in decision.status["scaling"]["message"]
    assert decision.requeue_after is not None and 55 < decision.requeue_after <= LOAD_GRACE_SECONDS
    long_ago = st.condition(st.READY, True, "Emitting", "emits", time="2020-01-01T00:00:00Z")
    world.shards["t-8-16"]["status"]["conditions"] = [long_ago]
    (patch,) = actions_of(task_pass(world), Patch)
    assert patch.name == "t-0-8" and patch.patch["spec"]["split"]["by"] == "load", "the one with rows"


def test_the_scaling_event_survives_a_refused_status_write():
    """Kopf annotates a Task right after a spec edit (kubectl scale), so the pass that asks for the split may find
    its status write refused (a newer version): the ScalingUp event is posted with the patch, and the next pass
    (which sees the request) asks for nothing more."""
    kube = new_world({**SPEC, "shards": 1})
    events: list = []
    converge(kube, events)
    assert [v.phase for v in owners(shard_views(kube, NS, "t"))] == [ShardPhase.RUNNING]
    kube.patch_custom("tasks", NS, "t", {"spec": {"shards": 2}})
    original = kube.patch_custom_status

    def refuse(plural, namespace, name, status, **kwargs):
        if plural == "tasks":
            raise Conflict("the Task changed meanwhile")
        return original(plural, namespace, name, status, **kwargs)

    kube.patch_custom_status = refuse
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    assert [e[2] for e in events].count("ScalingUp") == 1
    assert kube.shards()["t-0-16"]["spec"]["split"] == {"requested": True, "by": "midpoint"}
    kube.patch_custom_status = original
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    assert [e[2] for e in events].count("ScalingUp") == 1
    assert kube.objects[("tasks", "t")]["status"]["scaling"]["decision"] == "Wait"


def test_a_rolling_or_suspended_task_does_not_split():
    world = scaled_world(3)
    world.tasks[TASK]["spec"]["suspend"] = True
    decision = task_pass(world)
    assert "the Task is suspended" in decision.status["scaling"]["message"] and actions_of(decision, Patch) == []
    world = scaled_world(3)
    world.tasks[TASK]["spec"]["spark"]["image"] = "img:2"  # a template change: the shards roll first
    decision = task_pass(world)
    (roll,) = actions_of(decision, Patch)
    assert "split" not in roll.patch.get("spec", {}) and "annotations" in roll.patch["metadata"]
    assert "the shards roll to template" in decision.status["scaling"]["message"]


# ---------------------------------------------------------------- the model, the CRD and the template hash


def test_spec_shards_is_not_part_of_the_template_hash():
    base = copy.deepcopy(SPEC)
    hashes = {parse_task({"spec": {**base, "shards": n}}).template_hash for n in (1, 2, 16)}
    assert hashes == {parse_task({"spec": base}).template_hash}, "changing spec.shards must not roll the shards"
    assert "shards" not in builders.template_of(TaskSpec.from_k8s({**base, "shards": 4}))
    assert parse_task({"spec": {**base, "spark": {"image": "img:2"}}}).template_hash not in hashes, "sanity"


def test_spec_shards_above_max_key_groups_is_refused_naming_the_field_and_the_limit():
    with pytest.raises(ValidationError) as info:
        TaskSpec.from_k8s({**SPEC, "shards": 17})
    message = shards_over_limit_message(17, 16)
    assert message == (
        "spec.shards: 17 must be at most spec.maxKeyGroups (16): each shard owns one key group or more, so a Task "
        "has at most maxKeyGroups shards"
    )
    assert message in str(info.value)
    with pytest.raises(ValidationError, match="shards"):
        TaskSpec.from_k8s({**SPEC, "shards": 0})
    assert TaskSpec.from_k8s({**SPEC, "shards": 16}).shards == 16
    # The CRD's CEL rule says the same: its messageExpression formats the values into the same text.
    schema = build_crds()["taskshard.io_tasks.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    (rule,) = [r for r in spec["x-kubernetes-validations"] if r["rule"].endswith("self.shards <= self.maxKeyGroups")]
    assert rule["rule"] == "!has(self.shards) || self.shards <= self.maxKeyGroups"
    assert "spec.shards" in rule["message"] and "spec.maxKeyGroups" in rule["message"]
    template = re.fullmatch(r"'(.*)'\.format\(\[self\.shards, self\.maxKeyGroups\]\)", rule["messageExpression"])
    assert template is not None and template.group(1) % (17, 16) == message
    assert (spec["properties"]["shards"]["minimum"], spec["properties"]["shards"]["maximum"]) == (1, 32768)
    status = schema["properties"]["status"]["properties"]
    assert status["selector"]["type"] == "string" and status["scaling"]["properties"]["decision"]["enum"] == [
        d.value for d in ScalingDecision
    ]


# ---------------------------------------------------------------- in memory, end to end


def test_in_memory_one_to_three_shards_by_two_consecutive_splits_and_back_by_two_merges():
    """The reconcilers against the in-memory API (no load data there: midpoint splits, widest range first):
    spec.shards 3 on a one-shard Task gives two splits, the second requested only after the first finished;
    spec.shards 1 afterwards gives two merges, one at a time, back to one shard over [0, 16)."""
    kube = new_world({**SPEC, "shards": 3})
    events: list = []
    asked: list[tuple[str, list[str]]] = []
    original = kube.patch_custom

    def spy(plural, namespace, name, patch):
        if (patch.get("spec") or {}).get("split"):
            phases = {n: (s.get("status") or {}).get("phase") for n, s in kube.shards().items()}
            asked.append((name, sorted(n for n, p in phases.items() if p and ShardPhase(p).splitting)))
        return original(plural, namespace, name, patch)

    kube.patch_custom = spy
    converge(kube, events, passes=120)
    assert [name for name, _ in asked] == ["t-0-16", "t-0-8"], asked
    assert all(splitting == [] for _, splitting in asked), "a split was requested while another was in progress"
    active = sorted(v.key_groups for v in owners(shard_views(kube, NS, "t")))
    assert active == [KeyGroupRange(0, 4), KeyGroupRange(4, 8), KeyGroupRange(8, 16)]
    assert all(v.phase == ShardPhase.RUNNING for v in owners(shard_views(kube, NS, "t")))
    assert [e[2] for e in events].count("ScalingUp") == 2
    task = kube.objects[("tasks", "t")]
    assert task["status"]["shards"] == 3 and task["status"]["scaling"]["decision"] == "NoChange"
    assert scaled_condition(task["status"])["status"] == "True"
    assert "shard" not in task["status"]["scaling"], "the merge patch removed the split's shard"

    kube.patch_custom("tasks", NS, "t", {"spec": {"shards": 1}})
    converge(kube, events, passes=200)
    active = owners(shard_views(kube, NS, "t"))
    assert [v.key_groups for v in active] == [KeyGroupRange(0, 16)] and active[0].phase == ShardPhase.RUNNING
    assert active[0].merge_parents, "the last shard is a merged one"
    assert [e[2] for e in events].count("ScalingDown") == 2
    merged = [n for n, s in kube.shards().items() if (s.get("status") or {}).get("phase") == "Merged"]
    assert len(merged) == 4, merged
    cond = scaled_condition(kube.objects[("tasks", "t")]["status"])
    assert (cond["status"], cond["reason"]) == ("True", "DesiredShards")
