"""Aborting a split and the split finalizer, as decisions (data): a withdrawn request before the hand-over undoes
the split (children deleted, the parent's pod run with ``--abort-split``, back to Pending); after the hand-over it
is too late and said so; a second split point is refused; a shard mid-split keeps ``taskshard.io/split`` so its
deletion waits for the split, and loses it once the split is over (or its Task goes)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_runtime.protocol import SplitAbortSummary
from taskshard_operator import naming
from taskshard_operator import status as st
from taskshard_operator.act import Create, Delete, Patch
from taskshard_operator.reconcile_shard import decide_shard

from .fake_observed import (
    DRAIN_SUMMARY,
    HIGH,
    LONG_AGO,
    LOW,
    NS,
    PARENT,
    TASK,
    World,
    actions_of,
    add_children,
    add_shard,
    condition,
    decide,
    drained_status,
    kinds,
    make_pod,
    running,
    split_status,
    terminated,
)

pytestmark = pytest.mark.unit

WITHDRAWN = {"requested": False, "at": 8}


def withdrawn_world(phase: str, *, split: dict[str, Any] | None = None) -> World:
    """The parent in ``phase`` with a new generation of ``spec.split`` (withdrawn unless ``split`` says else)."""
    world = World()
    status = drained_status() if phase in ("Drained", "ChildrenCreated") else split_status()
    add_shard(world, PARENT, phase=phase, generation=3, observed_generation=2, status=status, split=split or WITHDRAWN)
    add_children(world)
    return world


def aborting_world() -> World:
    world = World()
    add_shard(world, PARENT, phase="AbortingSplit", generation=3, observed_generation=3, status=split_status())
    return world


def abort_pod(message: dict[str, Any] | None = None, *, phase: str = "Running") -> dict[str, Any]:
    pod = make_pod(PARENT, phase=phase, state=running() if message is None else terminated(0, message))
    pod["metadata"]["annotations"][naming.ANNOTATION_ABORT_SPLIT] = f"{LOW},{HIGH}"
    return pod


ABORTED = SplitAbortSummary(TASK, PARENT, 41, (LOW, HIGH), writer_epoch=3).to_json()


@pytest.mark.parametrize("phase", ["SplitRequested", "Draining"])
@pytest.mark.parametrize("split", [WITHDRAWN, None], ids=["requested-false", "removed"])
def test_a_withdrawn_request_before_the_hand_over_starts_the_abort(phase, split):
    world = withdrawn_world(phase, split=split)
    if split is None:
        del world.shards[PARENT]["spec"]["split"]
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "AbortingSplit"
    assert decision.status["observedGeneration"] == 3
    assert kinds(decision) == [], "the phase is written before anything is deleted"
    assert condition(decision, st.PROGRESSING)["reason"] == "AbortingSplit"
    assert condition(decision, st.SPLITTING)["status"] == "True", "still splitting: the finalizer stays"
    assert "SplitAborting" in [e.reason for e in decision.events]


def test_a_withdrawal_that_finds_the_parent_drained_lets_the_split_complete():
    world = withdrawn_world("Draining")
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Drained", "the drain summary wins: the children own the halves"
    assert condition(decision, st.SPLIT_REJECTED)["reason"] == "SplitAbortTooLate"
    assert decision.status["observedGeneration"] == 3


@pytest.mark.parametrize("phase", ["Drained", "ChildrenCreated"])
def test_a_withdrawal_after_the_hand_over_is_too_late_and_said_once(phase):
    world = withdrawn_world(phase)
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    decision = decide(world, PARENT)
    rejected = condition(decision, st.SPLIT_REJECTED)
    assert rejected["status"] == "True" and rejected["reason"] == "SplitAbortTooLate", rejected
    assert PARENT in rejected["message"] and "handed its range over" in rejected["message"]
    assert decision.status["observedGeneration"] == 3
    assert decision.status.get("phase", phase) != "AbortingSplit"
    assert [e.reason for e in decision.events if e.type == "Warning"] == ["SplitAbortTooLate"]


def test_a_second_split_point_during_a_split_is_refused_naming_both():
    world = withdrawn_world("Draining", split={"requested": True, "at": 4})
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    rejected = condition(decision, st.SPLIT_REJECTED)
    assert rejected["reason"] == "SplitInProgress"
    assert "spec.split.at: 4" in rejected["message"] and "splitting at key group 8" in rejected["message"]
    assert "phase" not in decision.status, "the split in progress goes on"


def test_the_same_request_again_changes_nothing_but_the_observed_generation():
    world = withdrawn_world("Draining", split={"requested": True})
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert decision.status == {"observedGeneration": 3}
    assert decision.actions == []


def test_aborting_deletes_the_children_and_stops_the_parent_pod_then_waits():
    world = aborting_world()
    add_children(world)
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    world.pods[LOW] = make_pod(LOW, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Delete(taskshards)", "Delete(taskshards)", "Delete(pods)"]
    low, high, pod = decision.actions
    assert (low.name, low.uid, high.name) == (LOW, f"uid-{LOW}", HIGH)
    assert pod.grace is None, "the parent stops gracefully (SIGTERM: a resumable stop at a batch boundary)"
    message = condition(decision, st.PROGRESSING)["message"]
    assert f"TaskShard {LOW}" in message and f"pod {naming.pod_name(LOW)}" in message
    assert decision.requeue_after is not None
    assert "phase" not in decision.status


def test_aborting_leaves_alone_a_shard_of_a_child_name_that_is_not_a_child():
    world = aborting_world()
    add_shard(world, LOW, phase="Running")  # not restoring from the parent
    decision = decide(world, PARENT)
    assert not actions_of(decision, Delete, naming.SHARD_PLURAL)


def test_aborting_runs_the_parent_pod_with_abort_split_once_everything_is_gone():
    world = aborting_world()
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Create(pods)"]
    (create,) = actions_of(decision, Create, "pods")
    assert create.body["spec"]["containers"][0]["command"][-2:] == ["--abort-split", f"{LOW},{HIGH}"]
    assert create.body["metadata"]["annotations"][naming.ANNOTATION_ABORT_SPLIT] == f"{LOW},{HIGH}"
    assert "phase" not in decision.status


def test_aborting_waits_for_the_abort_pod():
    world = aborting_world()
    world.pods[PARENT] = abort_pod()
    decision = decide(world, PARENT)
    assert decision.actions == [] and "phase" not in decision.status


def test_an_aborted_summary_makes_the_shard_pending_without_its_split():
    world = aborting_world()
    world.shards[PARENT]["status"]["lineage"] = {"parent": "t-0-32", "children": [LOW, HIGH]}
    world.pods[PARENT] = abort_pod(ABORTED, phase="Succeeded")
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Pending"
    assert decision.status["split"] is None and decision.status["pod"] is None
    assert decision.status["lineage"] == {"parent": "t-0-32", "children": None}
    assert kinds(decision) == ["Delete(pods)"]
    assert "resumes from batch 41" in condition(decision, st.PROGRESSING)["message"]
    assert condition(decision, st.SPLITTING)["status"] == "False"
    assert "SplitAborted" in [e.reason for e in decision.events]


def test_an_abort_pod_that_ends_without_a_summary_is_run_again():
    world = aborting_world()
    world.pods[PARENT] = abort_pod({"event": "stopped", "batchId": 3}, phase="Succeeded")
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Delete(pods)"]
    assert condition(decision, st.DEGRADED)["reason"] == "AbortRetry"
    assert "phase" not in decision.status


@pytest.mark.parametrize("annotated", [False, True], ids=["old-parent-pod", "abort-pod"])
def test_a_parent_that_drained_before_it_stopped_makes_the_abort_too_late(annotated):
    world = aborting_world()
    world.pods[PARENT] = (
        abort_pod(DRAIN_SUMMARY, phase="Succeeded")
        if annotated
        else make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    )
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Drained"
    assert decision.status["finalCheckpoint"]["manifest"] == "/x/manifest.json"
    assert "SplitAbortTooLate" in [e.reason for e in decision.events]


# ---------------------------------------------------------------- the split finalizer


def finalizer_patches(decision) -> list[list[str]]:
    return [a.patch["metadata"]["finalizers"] for a in actions_of(decision, Patch, naming.SHARD_PLURAL)]


def test_a_shard_entering_its_split_gets_the_finalizer_first():
    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    world.shards[PARENT]["metadata"]["finalizers"] = ["example.com/other"]
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert kinds(decision)[0] == "Patch(taskshards)", "before the children exist"
    assert finalizer_patches(decision) == [["example.com/other", naming.HANDOVER_FINALIZER]]
    assert decision.actions[0].patch["metadata"]["resourceVersion"] == "10", "conditional on the observed version"


@pytest.mark.parametrize("phase", ["Split", "Pending", "Running"])
def test_the_finalizer_goes_once_the_split_is_over_or_undone(phase):
    world = World()
    add_shard(world, PARENT, phase=phase, status=drained_status() if phase == "Split" else {})
    world.shards[PARENT]["metadata"]["finalizers"] = [naming.HANDOVER_FINALIZER, "example.com/other"]
    decision = decide(world, PARENT)
    assert finalizer_patches(decision) == [["example.com/other"]]


def test_a_shard_deleted_mid_split_goes_on_with_its_split():
    world = withdrawn_world("Draining", split={"requested": True})
    world.shards[PARENT]["metadata"]["deletionTimestamp"] = LONG_AGO
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Drained"
    assert not finalizer_patches(decision)


def test_a_shard_deleted_outside_a_split_is_left_to_the_garbage_collector():
    world = World()
    add_shard(world, PARENT, phase="Running")
    world.shards[PARENT]["metadata"]["deletionTimestamp"] = LONG_AGO
    assert decide_shard(world, NS, PARENT) is None


def test_a_deleted_task_releases_the_finalizer_of_a_splitting_shard():
    world = withdrawn_world("Draining", split={"requested": True})
    world.tasks[TASK]["metadata"]["deletionTimestamp"] = LONG_AGO
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert finalizer_patches(decision) == [[]]
    assert "Delete(pods)" in kinds(decision)


def test_a_finalizer_patch_that_finds_a_newer_version_ends_the_pass_without_a_status_write():
    """The finalizer patch is conditional on the observed version: when the shard changed meanwhile, nothing more
    of the decision is carried out (no status write, no event) and the pass runs again shortly."""
    from taskshard_operator.act import CONFLICT_RETRY_SECONDS, carry_out
    from taskshard_operator.kube import Conflict

    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    world.shards[PARENT]["metadata"].pop("finalizers")
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert kinds(decision)[0] == "Patch(taskshards)" and decision.status["phase"] == "Draining"
    calls: list[str] = []

    class Kube:
        def patch_custom(self, plural, namespace, name, patch):
            calls.append("patch")
            raise Conflict("changed")

        def __getattr__(self, name):  # anything else would be a write after the refused patch
            raise AssertionError(f"{name} called after a refused conditional patch")

    posted: list = []
    again = carry_out(Kube(), world, decision, emit=lambda *args: posted.append(args))
    assert again == CONFLICT_RETRY_SECONDS and calls == ["patch"] and posted == []
    assert ("forget", "taskshards", PARENT) in world.calls
