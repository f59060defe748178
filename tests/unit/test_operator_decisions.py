"""The planners' decisions as data: what :func:`decide_shard` and :func:`decide_task` decide for every phase and pod
state, read from a small dict-backed :class:`~taskshard_operator.cache.Observed` that has no API at all.

A decision is checked as data: the new phase (``decision.status["phase"]``, absent when unchanged), the kinds of
the actions in order, the conditions written, and when the object wants another pass (``requeue_after``).
Nothing here carries a decision out; deciding must not write anything (the world is compared before and after).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest

from spark_runtime.keygroups import KeyGroupRange, initial_ranges
from spark_runtime.protocol import SummaryEvent
from taskshard_operator import naming
from taskshard_operator import status as st
from taskshard_operator.act import ApplyConfigMap, Backoff, Create, Decision, Delete, Patch
from taskshard_operator.cache import data_digest
from taskshard_operator.reconcile_shard import decide_shard
from taskshard_operator.reconcile_task import CREATE_PER_PASS, decide_task

from .fake_observed import (
    DRAIN_SUMMARY,
    HASH,
    HIGH,
    LONG_AGO,
    LOW,
    OLD_HASH,
    PARENT,
    TASK,
    World,
    actions_of,
    add_children,
    add_shard,
    condition,
    config_digest,
    decide,
    drained_status,
    kinds,
    make_pod,
    running,
    split_status,
    sync_config,
    terminated,
)
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- Pending / Running / Failed x pod states
# Per case: the pod, whether status.pod is set (a replacement), the back-off wait, whether the ConfigMap is in
# sync, the phase each starting phase moves to (None = unchanged), the action kinds, the Ready or Progressing
# reason written, and requeue_after (None, or a (low, high) range).
_KEEP = {"Pending": None, "Running": "Pending", "Failed": None}


"""_keep_phase: a not-yet-running pod leaves Failed as it is and makes anything else Pending."""


CASES: dict[str, dict[str, Any]] = {
    "missing-new": dict(
        pod=None,
        replacement=False,
        backoff=0.0,
        config=False,
        phases=_KEEP,
        actions=["ApplyConfigMap(new)", "Create(pods)"],
        reason=(st.READY, "PodStarting"),
        requeue=None,
    ),
    "missing-replacement-now": dict(
        pod=None,
        replacement=True,
        backoff=0.0,
        config=True,
        phases=_KEEP,
        actions=["Backoff(record)", "Create(pods)"],
        reason=(st.READY, "PodStarting"),
        requeue=None,
    ),
    "missing-replacement-backoff": dict(
        pod=None,
        replacement=True,
        backoff=7.5,
        config=True,
        phases=_KEEP,
        actions=[],
        reason=(st.PROGRESSING, "BackOff"),
        requeue=(7.5, 7.5),
    ),
    "created-not-started": dict(
        pod=lambda: make_pod(PARENT),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": None, "Running": None, "Failed": None},
        actions=[],
        reason=(st.READY, "PodStarting"),
        requeue=None,
    ),
    "running-stable": dict(
        pod=lambda: make_pod(PARENT, phase="Running", state=running()),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": "Running", "Running": None, "Failed": "Running"},
        actions=["Backoff(reset)"],
        reason=(st.READY, "Emitting"),
        requeue=None,
    ),
    "running-just-started": dict(
        pod=lambda: make_pod(
            PARENT, phase="Running", state=running(dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        ),
        replacement=True,
        backoff=0.0,
        config=True,
        # A pod that replaced a failed one is not healthy until it ran STABLE_SECONDS: no flapping to Running.
        phases={"Pending": "Running", "Running": None, "Failed": None},
        actions=[],
        reason={
            "Pending": (st.READY, "Emitting"),
            "Running": (st.READY, "Emitting"),
            "Failed": (st.READY, "Recovering"),
        },
        requeue=(50.0, 61.0),  # looks again once it ran STABLE_SECONDS (then resets the back-off)
    ),
    "crash-loop": dict(
        pod=lambda: make_pod(
            PARENT,
            phase="Running",
            state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            restart_count=3,
        ),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": "Failed", "Running": "Failed", "Failed": None},
        actions=[],
        reason=(st.READY, "CrashLoopBackOff"),
        requeue=None,
    ),
    "pod-failed-with-message": dict(
        pod=lambda: make_pod(
            PARENT,
            phase="Failed",
            state=terminated(
                1, {"event": "failed", "error": "topic orders does not exist", "reason": "SourceTopicMissing"}
            ),
        ),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": "Failed", "Running": "Failed", "Failed": None},
        actions=["Delete(pods)"],
        reason=(st.READY, "SourceTopicMissing"),
        requeue=None,
    ),
    "pod-succeeded": dict(
        pod=lambda: make_pod(PARENT, phase="Succeeded", state=terminated(0, {"event": "stopped", "batchId": 4})),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": "Failed", "Running": "Failed", "Failed": None},
        actions=["Delete(pods)"],
        reason=(st.READY, "PodEnded"),
        requeue=None,
    ),
    # The kubelet evicts a pod whose /tmp passed its size limit (or when the node runs short): the shard says so.
    "pod-evicted": dict(
        pod=lambda: evicted(make_pod(PARENT, phase="Failed", state=terminated(137))),
        replacement=True,
        backoff=0.0,
        config=True,
        phases={"Pending": "Failed", "Running": "Failed", "Failed": None},
        actions=["Delete(pods)"],
        reason=(st.READY, "PodEvicted"),
        message='was evicted: Usage of EmptyDir volume "tmp" exceeds the limit "16Gi".',
        requeue=None,
    ),
    "pod-deleting": dict(
        pod=lambda: make_pod(PARENT, phase="Running", state=running(), deleting=True),
        replacement=True,
        backoff=0.0,
        config=True,
        phases=_KEEP,
        actions=[],
        reason=(st.READY, "PodTerminating"),
        requeue=None,
    ),
    "pod-other-template": dict(
        pod=lambda: make_pod(PARENT, phase="Running", state=running(), template=OLD_HASH),
        replacement=True,
        backoff=0.0,
        config=True,
        # a Failed shard stays Failed until its new pod commits (no flapping); its back-off is the old template's
        phases={"Pending": None, "Running": "Pending", "Failed": None},
        actions=["Delete(pods)"],
        reason=(st.PROGRESSING, "RollingRestart"),
        requeue=None,
    ),
}


def evicted(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the kubelet leaves it when its /tmp passed the emptyDir's size limit."""
    pod["status"].update(reason="Evicted", message='Usage of EmptyDir volume "tmp" exceeds the limit "16Gi". ')
    return pod


@pytest.mark.parametrize("phase", ["Pending", "Running", "Failed"])
@pytest.mark.parametrize("case", list(CASES))
def test_active_phase_by_pod_state(case: str, phase: str) -> None:
    c = CASES[case]
    world = World()
    status: dict[str, Any] = {"restarts": 2}
    if c["replacement"]:
        status["pod"] = naming.pod_name(PARENT)
    add_shard(world, PARENT, phase=phase, status=status)
    if c["pod"] is not None:
        world.pods[PARENT] = c["pod"]()
    if c["config"]:
        sync_config(world, PARENT)

    decision = decide(world, PARENT, backoff_wait=c["backoff"])

    want_phase = c["phases"][phase]
    assert decision.status.get("phase") == want_phase, decision.status
    assert decision.new_phase == want_phase
    assert kinds(decision) == c["actions"]
    type_, reason = c["reason"][phase] if isinstance(c["reason"], dict) else c["reason"]
    written = condition(decision, type_)
    assert written is not None and written["reason"] == reason, decision.status.get("conditions")
    assert c.get("message", "") in written["message"], written
    if c["requeue"] is None:
        assert decision.requeue_after is None
    else:
        low, high = c["requeue"]
        assert decision.requeue_after is not None and low <= decision.requeue_after <= high
    assert decision.plural == naming.SHARD_PLURAL and decision.name == PARENT
    assert decision.body["metadata"]["resourceVersion"] == "10", "the status write is conditional on this version"


def test_a_new_pod_is_built_for_this_shard():
    """The created pod and ConfigMap: names, owner, template hash, restarts carried over (a replacement counts one
    more restart; a new shard's first pod counts none)."""
    world = World()
    add_shard(world, PARENT, phase="Running", status={"restarts": 2, "pod": naming.pod_name(PARENT)})
    sync_config(world, PARENT)
    (create,) = actions_of(decide(world, PARENT), Create, "pods")
    meta = create.body["metadata"]
    assert meta["name"] == naming.pod_name(PARENT)
    assert meta["annotations"][naming.ANNOTATION_TEMPLATE_HASH] == HASH
    assert meta["annotations"][naming.ANNOTATION_RESTARTS_BASE] == "3"
    assert set(meta["annotations"]) == {naming.ANNOTATION_TEMPLATE_HASH, naming.ANNOTATION_RESTARTS_BASE}
    assert not [v for v in create.body["spec"]["volumes"] if "downwardAPI" in v], "no drain-request volume"
    assert meta["ownerReferences"][0]["uid"] == f"uid-{PARENT}"
    assert create.announce is not None and create.announce.reason == "PodCreated"
    decision = decide(world, PARENT)
    assert decision.status["restarts"] == 3
    assert actions_of(decision, Backoff)[0].key == f"uid-{PARENT}", "the back-off is keyed by the shard's uid"

    fresh = World()
    add_shard(fresh, PARENT, phase=None, observed_generation=None)
    decision = decide(fresh, PARENT)
    assert kinds(decision) == ["ApplyConfigMap(new)", "Create(pods)"]
    assert decision.status["phase"] == "Pending" and decision.status["restarts"] == 0
    assert decision.status["observedGeneration"] == 1 and decision.status["pod"] == naming.pod_name(PARENT)
    (apply,) = actions_of(decision, ApplyConfigMap)
    assert apply.body["metadata"]["name"] == naming.configmap_name(PARENT)
    assert data_digest(apply.body["data"]) == config_digest(fresh, PARENT)


def test_ended_and_rolled_pods_are_deleted_the_right_way():
    """An ended pod is deleted at once (grace 0, by uid: never a newer pod of the same name); a pod of another
    template is deleted gracefully (SIGTERM: it stops at a batch boundary, resumable)."""
    world = World()
    add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)})
    sync_config(world, PARENT)
    world.pods[PARENT] = CASES["pod-failed-with-message"]["pod"]()
    (delete,) = actions_of(decide(world, PARENT), Delete)
    assert (delete.name, delete.uid, delete.grace) == (naming.pod_name(PARENT), f"pod-uid-{PARENT}", 0)
    degraded = condition(decide(world, PARENT), st.DEGRADED)
    assert degraded["status"] == "True" and "topic orders does not exist" in degraded["message"]

    world.pods[PARENT] = CASES["pod-other-template"]["pod"]()
    (delete,) = actions_of(decide(world, PARENT), Delete)
    assert delete.name == naming.pod_name(PARENT) and delete.grace is None
    # A failing shard's pod emits nothing: the fix stops it at once (grace 0, by uid), no savepoint to wait for.
    world.shards[PARENT]["status"]["phase"] = "Failed"
    (delete,) = actions_of(decide(world, PARENT), Delete)
    assert (delete.name, delete.uid, delete.grace) == (naming.pod_name(PARENT), f"pod-uid-{PARENT}", 0)


def test_a_stopped_pod_keeps_its_last_checkpoint():
    world = World()
    add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)})
    sync_config(world, PARENT)
    world.pods[PARENT] = CASES["pod-succeeded"]["pod"]()
    decision = decide(world, PARENT)
    assert decision.status["lastCheckpoint"] == {"batchId": 4}
    assert "SIGTERM stop at batch 4" in condition(decision, st.READY)["message"]


# ---------------------------------------------------------------- the split request (Running)
def test_a_valid_split_request_on_a_running_shard_is_accepted_and_nothing_else_happens():
    world = World()
    add_shard(world, PARENT, phase="Running", generation=2, observed_generation=1, split={"requested": True})
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "SplitRequested"
    assert decision.status["split"]["at"] == 8 and decision.status["observedGeneration"] == 2
    assert kinds(decision) == [], "step 1 only writes status (no config, no pod touched)"
    assert [e.reason for e in decision.events] == ["PhaseSplitRequested", "SplitAccepted"]


def test_a_split_request_of_a_pending_shard_waits_until_it_runs():
    """Not refused: the request stays unobserved (SplitRejected=False, reason SplitWaiting) while the shard
    starts, and is taken once it runs."""
    world = World()
    add_shard(world, PARENT, phase="Pending", generation=2, observed_generation=1, split={"requested": True, "at": 4})
    decision = decide(world, PARENT)
    assert decision.status.get("phase", "Pending") == "Pending"
    waiting = condition(decision, st.SPLIT_REJECTED)
    assert waiting["status"] == "False" and waiting["reason"] == "SplitWaiting", waiting
    assert "observedGeneration" not in decision.status
    assert "Create(pods)" in kinds(decision), "the shard still starts"
    assert [e.reason for e in decision.events if e.reason == "SplitWaiting"] == ["SplitWaiting"]


def test_a_split_request_of_a_failed_shard_is_refused_without_a_phase_change():
    world = World()
    add_shard(world, PARENT, phase="Failed", generation=2, observed_generation=1, split={"requested": True, "at": 4})
    decision = decide(world, PARENT)
    assert "phase" not in decision.status or decision.status["phase"] == "Failed"
    rejected = condition(decision, st.SPLIT_REJECTED)
    assert rejected["status"] == "True" and "only a Running shard can be split" in rejected["message"]
    assert decision.status["observedGeneration"] == 2


# ---------------------------------------------------------------- split steps


def test_split_requested_creates_standby_children_and_leaves_the_pod_alone():
    """The children hand over with the parent through storage: the parent's pod is neither patched nor
    replaced, it keeps processing until its runtime stops by itself."""
    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)

    assert decision.status["phase"] == "Draining"
    assert decision.status["lineage"] == {"children": [LOW, HIGH]}
    assert kinds(decision) == ["Create(taskshards)", "Create(taskshards)"]
    assert not actions_of(decision, Patch), "the parent's pod is not annotated"
    low, high = actions_of(decision, Create, naming.SHARD_PLURAL)
    manifest = "/data/state/t/shards/t-0-16/drained.json"
    for create, name, kg in ((low, LOW, {"start": 0, "end": 8}), (high, HIGH, {"start": 8, "end": 16})):
        assert create.body["metadata"]["name"] == name
        assert create.body["spec"]["keyGroups"] == kg
        assert create.body["spec"]["restoreFrom"] == {"parent": PARENT, "manifest": manifest}
        assert create.body["metadata"]["ownerReferences"][0]["uid"] == "task-uid", "owned by the Task"
        assert create.body["metadata"]["annotations"][naming.ANNOTATION_TEMPLATE_HASH] == HASH
    assert "Draining" in [e.reason for e in decision.events]


def test_split_requested_recreates_a_missing_pod_without_a_drain_annotation():
    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    add_children(world)
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Create(pods)"], "the children exist: not created again"
    (create,) = actions_of(decision, Create, "pods")
    annotations = create.body["metadata"]["annotations"]
    assert set(annotations) == {naming.ANNOTATION_TEMPLATE_HASH, naming.ANNOTATION_RESTARTS_BASE}
    assert not [v for v in create.body["spec"]["volumes"] if "downwardAPI" in v]
    assert decision.status["phase"] == "Draining"


@pytest.mark.parametrize("taken", [LOW, HIGH])
def test_a_child_name_taken_by_a_non_child_holds_the_split(taken: str):
    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    add_shard(world, taken, phase="Running")  # not restoring from the parent: a stray of that name
    decision = decide(world, PARENT)
    assert "phase" not in decision.status, "no phase change while the name is taken"
    assert "lineage" not in decision.status
    degraded = condition(decision, st.DEGRADED)
    assert degraded["status"] == "True" and degraded["reason"] == "ChildNameTaken" and taken in degraded["message"]
    assert not actions_of(decision, Patch, "pods"), "the pod is left alone: it keeps processing"
    assert all(a.body["metadata"]["name"] != taken for a in actions_of(decision, Create, naming.SHARD_PLURAL))
    assert [e.reason for e in decision.events] == ["ChildNameTaken"]


def test_draining_pod_that_exited_with_a_drain_summary_makes_the_shard_drained():
    world = World()
    add_shard(world, PARENT, phase="Draining", generation=2, observed_generation=2, status=split_status())
    add_children(world)
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Drained"
    assert decision.status["finalCheckpoint"] == {"batchId": 7, "manifest": "/x/manifest.json"}
    assert decision.status["lastCheckpoint"] == decision.status["finalCheckpoint"]
    assert kinds(decision) == [], "the pod is deleted in the next step, after Drained is written"


def test_draining_without_a_pod_recreates_it_without_a_drain_annotation():
    """A pod deleted during the hand-over is recreated as any pod is: its runtime resumes from the recovery log
    and continues the hand-over through storage."""
    world = World()
    add_shard(world, PARENT, phase="Draining", generation=2, observed_generation=2, status=split_status())
    add_children(world)
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Create(pods)"]
    (create,) = actions_of(decision, Create, "pods")
    annotations = create.body["metadata"]["annotations"]
    assert set(annotations) == {naming.ANNOTATION_TEMPLATE_HASH, naming.ANNOTATION_RESTARTS_BASE}
    assert annotations[naming.ANNOTATION_RESTARTS_BASE] == "2"
    assert not [v for v in create.body["spec"]["volumes"] if "downwardAPI" in v]
    assert "phase" not in decision.status


@pytest.mark.parametrize(
    ("pod", "want_actions", "want_reason"),
    [
        (lambda: make_pod(PARENT, phase="Running", state=running()), [], None),
        (lambda: make_pod(PARENT, phase="Running", state=running(), restart_count=1), [], None),
        (lambda: make_pod(PARENT, phase="Running", state=running(), deleting=True), [], None),
        (
            lambda: make_pod(PARENT, phase="Running", state={"waiting": {"reason": "CrashLoopBackOff"}}),
            [],
            "DrainRetry",
        ),
        (
            lambda: make_pod(PARENT, phase="Succeeded", state=terminated(0, {"event": "stopped"})),
            ["Delete(pods)"],
            "DrainWithoutManifest",
        ),
    ],
    ids=["still-handing-over", "restarted-in-place", "deleting", "crash-loop", "ended-without-manifest"],
)
def test_draining_waits_for_a_drain_summary(pod, want_actions, want_reason):
    """Draining never moves on without a drain summary with a manifest (no phase change in any of these), and
    never patches the pod: the parent's runtime stops by itself."""
    world = World()
    add_shard(world, PARENT, phase="Draining", generation=2, observed_generation=2, status=split_status())
    add_children(world)
    world.pods[PARENT] = pod()
    decision = decide(world, PARENT)
    assert "phase" not in decision.status and "finalCheckpoint" not in decision.status
    assert kinds(decision) == want_actions
    degraded = condition(decision, st.DEGRADED)
    assert (degraded or {}).get("reason") == want_reason


def test_drained_deletes_the_stopped_pod_and_hands_over_to_the_children():
    world = World()
    add_shard(world, PARENT, phase="Drained", generation=2, observed_generation=2, status=drained_status())
    add_children(world)
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, DRAIN_SUMMARY))
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "ChildrenCreated"
    assert kinds(decision) == ["Delete(pods)"]
    assert actions_of(decision, Delete)[0].grace == 0
    assert "pod" in decision.status and decision.status["pod"] is None, "status.pod is cleared"


def test_drained_creates_children_the_cache_does_not_show():
    world = World()
    add_shard(world, PARENT, phase="Drained", generation=2, observed_generation=2, status=drained_status())
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Create(taskshards)", "Create(taskshards)"]
    assert decision.status["phase"] == "ChildrenCreated"


def test_drained_never_hands_over_while_the_parent_container_could_run():
    world = World()
    add_shard(world, PARENT, phase="Drained", generation=2, observed_generation=2, status=drained_status())
    add_children(world)
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert decision.status == {} and decision.actions == []


@pytest.mark.parametrize("phases", [(None, None), ("Pending", None), (None, "Running")])
def test_children_created_waits_until_both_children_were_seen(phases):
    world = World()
    add_shard(world, PARENT, phase="ChildrenCreated", generation=2, observed_generation=2, status=drained_status())
    add_children(world, phases=phases)
    world.configmaps[PARENT] = "some-digest"
    decision = decide(world, PARENT)
    assert decision.status == {}, "no write until both children have a phase"
    assert decision.actions == []


@pytest.mark.parametrize("configmap", [True, False])
def test_children_created_becomes_split_once_both_children_have_a_phase(configmap: bool):
    world = World()
    add_shard(world, PARENT, phase="ChildrenCreated", generation=2, observed_generation=2, status=drained_status())
    add_children(world, phases=("Pending", "Running"))
    if configmap:
        world.configmaps[PARENT] = "some-digest"
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Split"
    assert kinds(decision) == (["Delete(configmaps)"] if configmap else [])
    if configmap:
        assert actions_of(decision, Delete)[0].name == naming.configmap_name(PARENT)
    assert condition(decision, st.SPLITTING)["status"] == "False"


def test_split_refuses_a_new_split_request():
    world = World()
    add_shard(
        world,
        PARENT,
        phase="Split",
        generation=3,
        observed_generation=2,
        status=drained_status(),
        split={"requested": True, "at": 4},
    )
    add_children(world, phases=("Running", "Running"))
    decision = decide(world, PARENT)
    assert "phase" not in decision.status
    assert decision.status["observedGeneration"] == 3
    rejected = condition(decision, st.SPLIT_REJECTED)
    assert rejected["status"] == "True" and rejected["reason"] == "InvalidSplitRequest"
    assert kinds(decision) == []
    assert [e.reason for e in decision.events] == ["SplitRejected"]

    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    assert kinds(decide(world, PARENT)) == ["Delete(pods)"], "a split shard keeps no pod"


def test_the_active_label_follows_the_terminal_phase():
    world = World()
    body = add_shard(world, PARENT, phase="Split", generation=2, observed_generation=2, status=drained_status())
    body["metadata"]["labels"][naming.LABEL_ACTIVE] = "true"
    decision = decide(world, PARENT)
    assert kinds(decision) == ["Patch(taskshards)"]
    (patch,) = decision.actions
    assert patch.name == PARENT and patch.patch == {"metadata": {"labels": {naming.LABEL_ACTIVE: "false"}}}


# ---------------------------------------------------------------- standby children
def standby_world(parent_phase: str, child_phase: str | None) -> World:
    world = World()
    add_shard(world, PARENT, phase=parent_phase, generation=2, observed_generation=2, status=drained_status())
    add_shard(world, LOW, phase=child_phase, restore_from=PARENT, observed_generation=None)
    add_shard(world, HIGH, phase=None, restore_from=PARENT, observed_generation=None)
    sync_config(world, LOW)
    world.pods[LOW] = make_pod(LOW, phase="Running", state=running())
    return world


@pytest.mark.parametrize("parent_phase", ["SplitRequested", "Draining", "Drained"])
def test_a_child_whose_parent_holds_the_range_is_pending_on_standby(parent_phase: str):
    decision = decide(standby_world(parent_phase, None), LOW)
    assert decision.status["phase"] == "Pending"
    ready = condition(decision, st.READY)
    assert ready["status"] == "False" and ready["reason"] == "Standby" and PARENT in ready["message"]
    assert decision.status["lineage"] == {"parent": PARENT}
    assert not actions_of(decision, Create), "its pod runs (on standby): nothing is created"


@pytest.mark.parametrize("parent_phase", ["ChildrenCreated", "Split"])
def test_a_child_runs_once_the_parent_handed_over(parent_phase: str):
    decision = decide(standby_world(parent_phase, None), LOW)
    assert decision.status["phase"] == "Running"
    assert condition(decision, st.READY)["reason"] == "Emitting"


def test_a_standby_child_without_a_pod_gets_one_despite_the_parent_owning_the_range():
    world = standby_world("Draining", None)
    del world.pods[LOW]
    decision = decide(world, LOW)
    assert kinds(decision) == ["Create(pods)"], "a child overlaps only its parent, which it waits for"


@pytest.mark.parametrize("parent_phase", ["SplitRequested", "Draining"])
def test_a_suspended_task_keeps_standby_children_running_until_the_hand_over(parent_phase: str):
    """The parent stops only once both children are ready: suspending them would leave it running for good."""
    world = standby_world(parent_phase, None)
    world.tasks[TASK]["spec"]["suspend"] = True
    decision = decide(world, LOW)
    assert not actions_of(decision, Delete), "the standby child's pod is not stopped"
    assert decision.status["phase"] == "Pending" and condition(decision, st.READY)["reason"] == "Standby"
    del world.pods[LOW]
    assert kinds(decide(world, LOW)) == ["Create(pods)"]


@pytest.mark.parametrize("parent_phase", ["ChildrenCreated", "Split"])
def test_a_suspended_task_stops_a_child_once_the_parent_handed_over(parent_phase: str):
    world = standby_world(parent_phase, "Running")
    world.tasks[TASK]["spec"]["suspend"] = True
    decision = decide(world, LOW)
    assert kinds(decision) == ["Delete(pods)"]
    assert condition(decision, st.READY)["reason"] == "Suspending"


def test_a_child_that_failed_on_standby_goes_back_to_standby_not_running():
    decision = decide(standby_world("Draining", "Failed"), LOW)
    assert condition(decision, st.READY)["reason"] == "Standby"
    assert decision.status.get("phase") == "Pending"


# ---------------------------------------------------------------- overlap and config
def test_a_shard_over_an_owned_range_gets_no_pod():
    world = World()
    add_shard(world, PARENT, phase="Running")
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    sync_config(world, PARENT)
    add_shard(world, "stray", phase=None, observed_generation=None, key_groups=KeyGroupRange(4, 12))
    decision = decide(world, "stray")
    assert not actions_of(decision, Create, "pods")
    ready, degraded = condition(decision, st.READY), condition(decision, st.DEGRADED)
    assert ready["reason"] == "RangeOverlap" and degraded["status"] == "True"
    assert f"{PARENT} [0, 16)" in degraded["message"]
    assert [e.reason for e in decision.events] == ["RangeOverlap"]

    # the owner loses its pod: it is not replaced either while the stray overlaps it
    del world.pods[PARENT]
    world.shards[PARENT]["status"]["pod"] = naming.pod_name(PARENT)
    decision = decide(world, PARENT)
    assert not actions_of(decision, Create, "pods")
    assert condition(decision, st.READY)["reason"] == "RangeOverlap"
    assert "stray [4, 12)" in condition(decision, st.DEGRADED)["message"]


def test_a_repeated_overlap_posts_no_second_event():
    world = World()
    add_shard(world, PARENT, phase="Running")
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    add_shard(world, "stray", phase=None, observed_generation=None, key_groups=KeyGroupRange(4, 12))
    first = decide(world, "stray")
    world.shards["stray"]["status"].update(first.status)
    again = decide(world, "stray")
    assert again.events == [] and "conditions" not in again.status, "status already says so"


def running_world(*, template: str | None = None) -> World:
    world = World()
    add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)}, template=template)
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running(), template=template)
    return world


def test_a_config_with_the_cached_digest_is_not_applied():
    world = running_world()
    sync_config(world, PARENT)
    decision = decide(world, PARENT)
    assert not actions_of(decision, ApplyConfigMap)
    assert kinds(decision) == ["Backoff(reset)"]


def test_a_config_with_another_digest_is_replaced():
    world = running_world()
    world.configmaps[PARENT] = "another-digest"
    decision = decide(world, PARENT)
    (apply,) = actions_of(decision, ApplyConfigMap)
    assert apply.exists is True
    assert data_digest(apply.body["data"]) == config_digest(world, PARENT)
    assert apply.body["metadata"]["ownerReferences"][0]["uid"] == f"uid-{PARENT}"


def test_a_shard_not_rolled_yet_keeps_its_config():
    """The roll has not reached the shard (its annotation names an older template): its ConfigMap is not replaced,
    so a container restarting in place keeps the config it ran with; a missing one is still created."""
    world = running_world(template=OLD_HASH)
    world.configmaps[PARENT] = "another-digest"
    decision = decide(world, PARENT)
    assert not actions_of(decision, ApplyConfigMap)
    assert "phase" not in decision.status

    del world.configmaps[PARENT]
    assert kinds(decide(world, PARENT))[:1] == ["ApplyConfigMap(new)"]


def test_an_invalid_task_spec_touches_nothing():
    world = World({**SPEC, "initialShards": 99})
    add_shard(world, PARENT, phase="Running")
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    decision = decide(world, PARENT)
    assert decision.actions == [] and "phase" not in decision.status
    assert condition(decision, st.DEGRADED)["reason"] == "InvalidTaskSpec"


def test_a_deleted_task_stops_the_shard():
    world = World()
    add_shard(world, PARENT, phase="Running")
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    del world.tasks[TASK]
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Stopped"
    (delete,) = actions_of(decision, Delete, "pods")
    assert delete.grace is None, "graceful: SIGTERM stops at a batch boundary"


def test_a_gone_shard_decides_nothing():
    world = World()
    assert decide_shard(world, NS, "nope") is None
    body = add_shard(world, PARENT, phase="Running")
    body["metadata"]["deletionTimestamp"] = LONG_AGO
    assert decide_shard(world, NS, PARENT) is None


# ---------------------------------------------------------------- deciding is pure
def test_deciding_is_pure_and_repeatable():
    """Deciding twice from the same observation gives the same decision and writes nothing: the World has no API
    to write to, is unchanged afterwards, and its ``wrote``/``forget`` are never called (``decide`` checks both
    for every decision in this file)."""
    world = World()
    add_shard(world, PARENT, phase="SplitRequested", generation=2, observed_generation=2, status=split_status())
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())

    def stable(d: Decision) -> tuple:
        conditions = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in d.status["conditions"]]
        return kinds(d), {**d.status, "conditions": conditions}, [e.reason for e in d.events], d.requeue_after

    assert stable(decide(world, PARENT)) == stable(decide(world, PARENT))
    before = world.snapshot()
    assert decide_task(world, NS, TASK) is not None
    assert world.snapshot() == before and world.calls == []


# ---------------------------------------------------------------- decide_task
def test_a_new_task_creates_its_initial_shards():
    world = World({**SPEC, "initialShards": 2})
    decision = decide_task(world, NS, TASK)
    assert kinds(decision) == ["Create(taskshards)", "Create(taskshards)", "Create(poddisruptionbudgets)"]
    shards = actions_of(decision, Create, naming.SHARD_PLURAL)
    assert [a.body["metadata"]["name"] for a in shards] == [LOW, HIGH]
    for a in shards:
        assert a.body["metadata"]["ownerReferences"][0]["uid"] == "task-uid"
        assert a.body["metadata"]["annotations"][naming.ANNOTATION_TEMPLATE_HASH] == decision.status["templateHash"]
        assert a.announce is not None and a.announce.reason == "ShardCreated"
    assert decision.status["shards"] == 2
    assert decision.status["phase"] == "Pending"
    assert [s["name"] for s in decision.status["activeShards"]] == [LOW, HIGH]
    assert decision.requeue_after is None


def test_a_task_with_all_shards_creates_none():
    world = World({**SPEC, "initialShards": 2})
    add_shard(world, LOW, phase="Running")
    add_shard(world, HIGH, phase="Running")
    world.tasks[TASK]["status"] = {"disruptionBudget": {"name": f"{TASK}-shards", "minAvailable": 1}}
    decision = decide_task(world, NS, TASK)
    assert decision.actions == []
    assert decision.status["phase"] == "Running" and decision.status["shards"] == 2


def test_the_tasks_disruption_budget_follows_its_shard_count():
    """A node drain leaves all driver pods but one: an integer minAvailable (the disruption controller counts
    maxUnavailable only for pods whose controller scales), set again when the count changes, owned by the Task; a
    pod not ready may always go."""
    world = World({**SPEC, "initialShards": 2})
    (budget,) = actions_of(decide_task(world, NS, TASK), Create, "poddisruptionbudgets")
    assert budget.body["metadata"]["name"] == f"{TASK}-shards"
    assert budget.body["metadata"]["ownerReferences"][0]["uid"] == "task-uid"
    assert budget.body["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": {naming.LABEL_TASK: TASK, naming.LABEL_COMPONENT: naming.COMPONENT_SHARD}},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    for name in (LOW, HIGH):
        add_shard(world, name, phase="Running")
    world.tasks[TASK]["status"] = {"disruptionBudget": {"name": f"{TASK}-shards", "minAvailable": 1}}
    assert not actions_of(decide_task(world, NS, TASK), Create, "poddisruptionbudgets"), "unchanged: no call"
    add_shard(world, "t-0-4", phase="Running", key_groups=KeyGroupRange(0, 4))  # a split later: three owners
    add_shard(world, "t-4-8", phase="Running", key_groups=KeyGroupRange(4, 8))
    world.shards[LOW]["status"]["phase"] = "Split"
    decision = decide_task(world, NS, TASK)
    (budget,) = actions_of(decision, Create, "poddisruptionbudgets")
    assert budget.body["spec"]["minAvailable"] == 2
    assert decision.status["disruptionBudget"] == {"name": f"{TASK}-shards", "minAvailable": 2}


def test_many_initial_shards_are_created_a_batch_per_pass_without_duplicates():
    """maxKeyGroups 128 and initialShards 128 (initialShards <= maxKeyGroups <= 32768): CREATE_PER_PASS per pass,
    the next pass at once (requeue 0), no shard created twice, until all exist."""
    assert CREATE_PER_PASS < 128
    world = World({**SPEC, "maxKeyGroups": 128, "initialShards": 128})
    expected = [naming.shard_name(TASK, r) for r in initial_ranges(128, 128)]
    created: list[str] = []
    for _ in range(10):
        decision = decide_task(world, NS, TASK)
        names = [a.body["metadata"]["name"] for a in actions_of(decision, Create, naming.SHARD_PLURAL)]
        if not names:
            break
        remaining = len(expected) - len(created)
        assert len(names) == min(CREATE_PER_PASS, remaining)
        assert decision.requeue_after == (0.0 if remaining > CREATE_PER_PASS else None)
        assert not set(names) & set(created), "a shard created twice"
        created += names
        for a in decision.actions:
            if isinstance(a, Create) and a.plural == naming.SHARD_PLURAL:  # what the next pass's cache shows
                body = copy.deepcopy(a.body)
                body["metadata"].update(namespace=NS, uid=f"uid-{body['metadata']['name']}", resourceVersion="1")
                world.shards[body["metadata"]["name"]] = {**body, "status": {}}
    assert created == expected


def test_the_first_pass_over_128_shards_creates_exactly_create_per_pass():
    world = World({**SPEC, "maxKeyGroups": 128, "initialShards": 128})
    decision = decide_task(world, NS, TASK)
    creates = actions_of(decision, Create, naming.SHARD_PLURAL)
    assert len(creates) == CREATE_PER_PASS
    assert decision.requeue_after == 0
    assert creates[0].body["metadata"]["name"] == "t-0-1"


def test_an_invalid_task_fails_with_the_field_named():
    world = World({**SPEC, "initialShards": 99})
    decision = decide_task(world, NS, TASK)
    assert decision.actions == []
    assert decision.status["phase"] == "Failed"
    ready = condition(decision, st.READY)
    assert ready["reason"] == "InvalidSpec" and "initialShards" in ready["message"]
    assert [e.reason for e in decision.events] == ["InvalidSpec"]


def test_a_task_with_a_new_template_rolls_one_running_shard():
    world = World({**SPEC, "initialShards": 2})
    for name in (LOW, HIGH):
        add_shard(world, name, phase="Running", template=OLD_HASH)
        world.pods[name] = make_pod(name, phase="Running", state=running(), template=OLD_HASH)
    decision = decide_task(world, NS, TASK)
    (patch,) = actions_of(decision, Patch)
    assert patch.name == LOW
    assert patch.patch == {"metadata": {"annotations": {naming.ANNOTATION_TEMPLATE_HASH: HASH}}}


def test_an_invalid_split_request_of_a_pending_shard_is_refused_at_once():
    world = World()
    add_shard(world, PARENT, phase="Pending", generation=2, observed_generation=1, split={"requested": True, "at": 99})
    decision = decide(world, PARENT)
    rejected = condition(decision, st.SPLIT_REJECTED)
    assert rejected["status"] == "True" and "spec.split.at: 99" in rejected["message"]
    assert decision.status["observedGeneration"] == 2


def test_the_config_carries_the_last_committed_batch_and_the_fresh_start_decision():
    """The runtime refuses a recovery log older than status.lastCheckpoint (RecoveryLogMissing) unless the
    TaskShard is annotated taskshard.io/allow-fresh-start=true: both reach shard.json."""
    world = World()
    shard = add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)})
    shard["status"]["lastCheckpoint"] = {"batchId": 41}
    world.pods[PARENT] = make_pod(PARENT, phase="Running", state=running())
    world.configmaps[PARENT] = "another-digest"
    (apply,) = actions_of(decide(world, PARENT), ApplyConfigMap)
    config = json.loads(apply.body["data"][naming.CONFIG_KEY])
    assert config["expectedBatch"] == 41 and "allowFreshStart" not in config
    shard["metadata"]["annotations"][naming.ANNOTATION_ALLOW_FRESH_START] = "true"
    (apply,) = actions_of(decide(world, PARENT), ApplyConfigMap)
    assert json.loads(apply.body["data"][naming.CONFIG_KEY])["allowFreshStart"] is True


def test_a_child_that_runs_but_does_not_emit_yet_is_running_and_not_ready():
    """After the hand-over a child owns its range (Running) but is Ready only once its readiness probe sees it
    emit (it still catches up with the parent's final positions)."""
    world = standby_world("Split", None)
    world.pods[LOW] = make_pod(LOW, phase="Running", state=running(), ready=False)
    decision = decide(world, LOW)
    assert decision.status["phase"] == "Running"
    ready = condition(decision, st.READY)
    assert ready["status"] == "False" and ready["reason"] == "NotEmittingYet"
    assert "catching up" in ready["message"]


def test_a_pod_whose_runtime_ended_fenced_is_replaced_with_the_reason():
    """A runtime fenced by a later writer epoch exits 0 (``fenced``): the kubelet keeps it down, the operator
    replaces the pod (with back-off) and says why; the new runtime's epoch fences whatever fenced it."""
    from spark_runtime.protocol import FailureSummary

    world = World()
    add_shard(world, PARENT, phase="Running", status={"pod": naming.pod_name(PARENT)})
    sync_config(world, PARENT)
    report = FailureSummary(
        PARENT,
        f"storage: shard {PARENT}'s writer epoch 3 was superseded by epoch 4",
        reason="WriterFenced",
        field="storage",
        event=SummaryEvent.FENCED,
        pod_uid=f"pod-uid-{PARENT}",
        writer_epoch=3,
    )
    world.pods[PARENT] = make_pod(PARENT, phase="Succeeded", state=terminated(0, report.to_json()))
    decision = decide(world, PARENT)
    assert decision.status["phase"] == "Failed" and kinds(decision) == ["Delete(pods)"]
    degraded = condition(decision, st.DEGRADED)
    assert degraded["reason"] == "WriterFenced" and "superseded by epoch 4" in degraded["message"]
    assert [e.reason for e in decision.events if e.type == "Warning"] == ["WriterFenced"]


def test_a_replacement_that_committed_a_batch_is_healthy_before_the_stable_time():
    """After a failure the shard stays Failed until its new pod ran STABLE_SECONDS, or until the pod's own live
    metrics show a batch committed since it started (an older commit, or another pod's scrape, does not count)."""
    from spark_runtime.live import LiveStats
    from taskshard_operator.live import Scraped

    now = dt.datetime.now(dt.UTC)
    started = (now - dt.timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def decide_with(batch_time: float, pod_ip: str) -> Any:
        world = World()
        add_shard(world, PARENT, phase="Failed", status={"restarts": 2, "pod": naming.pod_name(PARENT)})
        pod = make_pod(PARENT, phase="Running", state=running(started))
        pod["status"]["podIP"] = "10.0.0.7"
        world.pods[PARENT] = pod
        sync_config(world, PARENT)
        stats = LiveStats(batch_id=3, batch_time=batch_time, rate=1.0, lag=0, lag_unit="bytes", state_rows=1,
                          dead_letters=0, emitting=True)  # fmt: skip
        world.scrapes[PARENT] = Scraped(stats, now.strftime("%Y-%m-%dT%H:%M:%SZ"), pod_ip)
        return decide(world, PARENT, backoff_wait=0.0)

    fresh = now.timestamp() - 2
    assert decide_with(fresh, "10.0.0.7").new_phase == "Running"
    assert decide_with(now.timestamp() - 60, "10.0.0.7").new_phase is None, "a commit from before the restart"
    assert decide_with(fresh, "10.0.0.9").new_phase is None, "another pod's scrape"
