"""The merge protocol against the in-memory API and the simulated world of ``fake_cluster``: two
adjacent shards become one (``spec.merge`` on the left one), crash-and-resume at every step, refusals, and
the ownership of the merged range moving at one observed moment (the Task's tiling never has a gap or an
overlap). A merge parent's simulated runtime drains once the merged shard's pod runs (its ready note)."""

from __future__ import annotations

import json

import pytest

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import naming
from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import reconcile_task

from .fake_cluster import (
    Crash,
    FakeKube,
    converge,
    count_creations,
    new_world,
    owner_ranges,
    phases,
    request_split,
    world_step,
)
from .operator_spec import NS, SPEC

pytestmark = pytest.mark.unit

MERGED = naming.shard_name("t", KeyGroupRange(0, 16), naming.merge_family("t-0-8", "t-8-16"))


def two_shards() -> FakeKube:
    kube = new_world({**SPEC, "initialShards": 2})
    converge(kube, [])
    assert phases(kube) == {"t-0-8": "Running", "t-8-16": "Running"}
    return kube


def request_merge(kube: FakeKube, left: str, right: str) -> None:
    kube.patch_custom("taskshards", NS, left, {"spec": {"merge": {"with": right}}})


def condition(kube: FakeKube, shard: str, kind: str) -> dict:
    return next(c for c in kube.shards()[shard]["status"]["conditions"] if c["type"] == kind)


def one_round(kube: FakeKube, events: list, *, hand_over: bool) -> None:
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    for name in list(kube.shards()):
        reconcile_shard(kube, kube, NS, name, emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
        assert sorted(owner_ranges(kube)) in ([KeyGroupRange(0, 8), KeyGroupRange(8, 16)], [KeyGroupRange(0, 16)]), (
            "the owners tile [0, 16) at every observed moment"
        )
    world_step(kube, {}, hand_over=hand_over)


def test_merge_protocol_end_to_end():
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    for _ in range(4):  # passes while the parents keep running: the merged shard waits on standby
        one_round(kube, events, hand_over=False)
    assert MERGED.startswith("t-0-16-m") and len(MERGED) == len("t-0-16-m") + 6
    assert phases(kube) == {"t-0-8": "Merging", "t-8-16": "Merging", MERGED: "Pending"}
    ready = condition(kube, MERGED, "Ready")
    assert ready["reason"] == "Standby" and "parents t-0-8 and t-8-16 have finished draining" in ready["message"]
    assert owner_ranges(kube) == [KeyGroupRange(0, 8), KeyGroupRange(8, 16)], "the parents own until both drained"
    assert kube.objects[("tasks", "t")]["status"]["phase"] == "Merging"
    for name in ("t-0-8", "t-8-16"):
        assert naming.HANDOVER_FINALIZER in kube.shards()[name]["metadata"]["finalizers"], "a deletion waits"

    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    merged = kube.shards()[MERGED]
    assert merged["spec"]["mergeFrom"] == [
        {"parent": "t-0-8", "manifest": "/data/state/t/shards/t-0-8/drained.json"},
        {"parent": "t-8-16", "manifest": "/data/state/t/shards/t-8-16/drained.json"},
    ]
    assert merged["spec"]["keyGroups"] == {"start": 0, "end": 16}
    assert merged["metadata"]["labels"][naming.LABEL_FAMILY] == MERGED.rsplit("-", 1)[1]
    assert merged["status"]["lineage"] == {"parents": ["t-0-8", "t-8-16"]}
    cfg = json.loads(kube.objects[("configmaps", f"{MERGED}-config")]["data"]["shard.json"])
    assert cfg["mergeFrom"] == merged["spec"]["mergeFrom"] and cfg.get("restoreFrom") is None
    for name, other, role in (("t-0-8", "t-8-16", "left"), ("t-8-16", "t-0-8", "right")):
        status = kube.shards()[name]["status"]
        assert {k: status["merge"][k] for k in ("with", "into", "role")} == {
            "with": other,
            "into": MERGED,
            "role": role,
        }
        assert status["finalCheckpoint"]["manifest"].endswith("/manifest.json")
        assert status["lineage"]["children"] == [MERGED]
        assert kube.shards()[name]["metadata"]["labels"][naming.LABEL_ACTIVE] == "false"
        assert naming.HANDOVER_FINALIZER not in (kube.shards()[name]["metadata"].get("finalizers") or [])
    assert set(kube.pods()) == {f"{MERGED}-driver"}
    assert not any(k == "configmaps" and n in ("t-0-8-config", "t-8-16-config") for k, n in kube.objects)
    assert owner_ranges(kube) == [KeyGroupRange(0, 16)]
    task = kube.objects[("tasks", "t")]["status"]
    assert task["phase"] == "Running" and [s["name"] for s in task["activeShards"]] == [MERGED]
    reasons = [e[2] for e in events]
    for r in ("MergeAccepted", "MergedShardCreated", "Merging", "Drained", "Merged"):
        assert r in reasons, r

    # The merged shard splits again: its children carry its family, so they never collide with t-0-8 / t-8-16.
    request_split(kube, MERGED, at=8)
    converge(kube, events)
    family = MERGED.rsplit("-", 1)[1]
    assert phases(kube)[f"t-0-8-{family}"] == "Running" and phases(kube)[f"t-8-16-{family}"] == "Running"
    assert phases(kube)[MERGED] == "Split"


def test_crash_at_every_mutation_of_a_merge_completes_without_duplicates():
    """Kill the operator after the n-th API write of the merge, for every n; a fresh operator completes it."""
    reference = two_shards()
    request_merge(reference, "t-0-8", "t-8-16")
    start = reference.mutations
    converge(reference, [])
    total = reference.mutations - start
    assert total > 5
    for n in range(1, total + 1):
        kube = two_shards()
        request_merge(kube, "t-0-8", "t-8-16")
        kube.crash_after = kube.mutations + n
        with pytest.raises(Crash, match="operator killed"):
            converge(kube, [])
        converge(kube, [], backoff=PodReplacementBackoff(base=0.0))  # the restarted operator, with fresh memory
        assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}, f"crash at {n}"
        assert count_creations(kube, "taskshards") == {"t-0-8": 1, "t-8-16": 1, MERGED: 1}
        assert set(kube.pods()) == {f"{MERGED}-driver"}


@pytest.mark.parametrize(
    ("initial", "left", "right", "needle"),
    [
        (2, "t-0-8", "t-9-16", "no TaskShard of that name belongs to Task t"),
        (2, "t-0-8", "t-0-8", "is this shard itself"),
        (2, "t-8-16", "t-0-8", "does not start where t-8-16 [8, 16) ends"),
        (4, "t-0-4", "t-8-12", "does not start where t-0-4 [0, 4) ends"),
    ],
)
def test_bad_merge_requests_change_nothing(initial, left, right, needle):
    kube = new_world({**SPEC, "initialShards": initial})
    events: list = []
    converge(kube, events)
    before = phases(kube)
    pods_before = set(kube.pods())
    request_merge(kube, left, right)
    converge(kube, events)
    assert phases(kube) == before and set(kube.pods()) == pods_before
    assert "merge" not in kube.shards()[left]["status"]
    rejected = condition(kube, left, "MergeRejected")
    assert rejected["status"] == "True" and needle in rejected["message"], rejected
    assert any(e[1] == "Warning" and e[2] == "MergeRejected" and needle in e[3] for e in events)


def test_a_merge_with_a_shard_that_is_not_running_or_asks_for_more_is_refused():
    kube = two_shards()
    events: list = []
    request_split(kube, "t-8-16")  # its split is accepted first ...
    one_round(kube, events, hand_over=False)
    request_merge(kube, "t-0-8", "t-8-16")  # ... so it is not Running when the merge is asked for
    one_round(kube, events, hand_over=False)
    rejected = condition(kube, "t-0-8", "MergeRejected")
    assert (
        rejected["status"] == "True" and "t-8-16 is SplitRequested; both shards must be Running" in rejected["message"]
    )
    assert phases(kube)["t-0-8"] == "Running"

    kube = two_shards()
    kube.patch_custom("taskshards", NS, "t-8-16", {"spec": {"merge": {"with": "t-16-32"}}})  # refused itself ...
    request_merge(kube, "t-0-8", "t-8-16")
    one_round(kube, events, hand_over=False)
    rejected = condition(kube, "t-0-8", "MergeRejected")
    assert "t-8-16 asks for a merge with 't-16-32' (spec.merge) itself" in rejected["message"], rejected


def withdraw_merge(kube: FakeKube, left: str) -> None:
    kube.patch_custom("taskshards", NS, left, {"spec": {"merge": None}})


def test_a_merge_withdrawn_before_the_merged_shard_exists_is_undone_at_once():
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    reconcile_shard(kube, kube, NS, "t-0-8", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    assert phases(kube)["t-0-8"] == "MergeRequested"
    assert kube.shards()["t-8-16"]["metadata"]["annotations"][naming.ANNOTATION_MERGE_LEFT] == "t-0-8", "claimed"
    withdraw_merge(kube, "t-0-8")
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Running", "t-8-16": "Running"}
    assert MERGED not in kube.shards() and "merge" not in kube.shards()["t-0-8"]["status"]
    assert naming.ANNOTATION_MERGE_LEFT not in (kube.shards()["t-8-16"]["metadata"].get("annotations") or {})
    assert "MergeWithdrawn" in [e[2] for e in events]


def test_a_merge_withdrawn_while_no_parent_drained_is_undone_and_can_be_asked_again():
    """Merging, the merged shard warm on standby, neither parent drained: AbortingMerge; the merged shard's pod is
    replaced by one that fences it (its ready notes become void) and reports Aborted; the merged shard is deleted
    and both parents go on Running, their pods never stopped."""
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    for _ in range(4):
        one_round(kube, events, hand_over=False)
    assert phases(kube) == {"t-0-8": "Merging", "t-8-16": "Merging", MERGED: "Pending"}
    parent_pods = {n: kube.pods()[f"{n}-driver"]["metadata"]["uid"] for n in ("t-0-8", "t-8-16")}
    withdraw_merge(kube, "t-0-8")
    one_round(kube, events, hand_over=False)
    assert phases(kube)["t-0-8"] == "AbortingMerge"
    for _ in range(8):
        one_round(kube, events, hand_over=True)  # the parents would drain for a ready merged shard: it is fenced
    assert phases(kube) == {"t-0-8": "Running", "t-8-16": "Running"}, phases(kube)
    assert not kube.drained, "no parent drained for the withdrawn merge"
    assert {n: kube.pods()[f"{n}-driver"]["metadata"]["uid"] for n in parent_pods} == parent_pods, "never stopped"
    for name in ("t-0-8", "t-8-16"):
        status = kube.shards()[name]["status"]
        assert "merge" not in status and not (status.get("lineage") or {}).get("children")
        assert naming.HANDOVER_FINALIZER not in (kube.shards()[name]["metadata"].get("finalizers") or [])
    reasons = [e[2] for e in events]
    assert {"MergeAborting", "MergeAbortChecked", "MergeAborted"} <= set(reasons), reasons

    request_merge(kube, "t-0-8", "t-8-16")  # asked again: a new merged shard, a fresh writer epoch
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}


def test_a_merge_withdrawn_after_its_parents_drained_completes():
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    for _ in range(4):
        one_round(kube, events, hand_over=False)
    world_step(kube, {}, hand_over=True)  # both parents drain for the ready merged shard
    withdraw_merge(kube, "t-0-8")
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    assert "MergeAbortTooLate" in [e[2] for e in events]


def test_a_merge_withdrawn_while_its_parents_drain_completes():
    """The withdrawal is taken (AbortingMerge) while the parents drain for the still-ready merged shard: their
    drain is recorded and the merge completes (AbortingMerge -> Merging -> Merged); the merged shard never keeps
    an abort record. (A drain the operator cannot see yet is the abort pod's to find: the spark tier.)"""
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    for _ in range(4):
        one_round(kube, events, hand_over=False)
    withdraw_merge(kube, "t-0-8")
    reconcile_shard(kube, kube, NS, "t-0-8", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    assert phases(kube)["t-0-8"] == "AbortingMerge"
    world_step(kube, {}, hand_over=True)  # the merged shard's pod still ran: both parents drained for it
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    assert kube.shards()[MERGED].get("status", {}).get("mergeAbort") is None
    assert "MergeAbortTooLate" in [e[2] for e in events]


def test_a_merge_that_does_not_finish_shows_merge_stalled_with_what_it_waits_for():
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    for _ in range(4):
        one_round(kube, events, hand_over=False)
    kube.delete_pod(NS, f"{MERGED}-driver")  # the merged shard never gets ready (say, no node has room)
    long_ago = "2020-01-01T00:00:00Z"
    for name in ("t-0-8", "t-8-16"):
        kube.patch_custom_status("taskshards", NS, name, {"merge": {"acceptedTime": long_ago}})
    reconcile_shard(kube, kube, NS, "t-0-8", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    degraded = condition(kube, "t-0-8", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "MergeStalled"), degraded
    assert "bound 600s" in degraded["message"] and f"{MERGED} is not running on standby" in degraded["message"]
    assert "t-0-8 has not drained" in degraded["message"] and "spec" in degraded["message"]
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    task = {c["type"]: c for c in kube.objects[("tasks", "t")]["status"]["conditions"]}
    assert (task["Degraded"]["status"], task["Degraded"]["reason"]) == ("True", "MergeStalled"), task["Degraded"]
    assert [e[2] for e in events].count("MergeStalled") == 1
    converge(kube, events)  # the merged shard's pod is created again and the merge completes
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    assert condition(kube, "t-0-8", "Degraded")["status"] == "False"


def test_a_hand_made_successor_gets_no_pod_and_forces_no_hand_over():
    """A TaskShard made by hand that names two running shards in mergeFrom (or one in restoreFrom) is not a
    successor their status names: it gets no pod (NotAChild), so it can never make them hand over."""
    kube = two_shards()
    events: list = []
    for name, spec in (
        ("fake-merge", {"mergeFrom": [{"parent": "t-0-8", "manifest": "/m"}, {"parent": "t-8-16", "manifest": "/n"}]}),
        ("fake-child", {"restoreFrom": {"parent": "t-8-16", "manifest": "/data/state/t/shards/t-8-16/drained.json"}}),
    ):
        kube._new(
            "taskshards",
            {
                "apiVersion": "taskshard.io/v1alpha1",
                "kind": "TaskShard",
                "metadata": {"name": name},
                "spec": {"taskRef": {"name": "t"}, "keyGroups": {"start": 0, "end": 16}, **spec},
            },
        )
    converge(kube, events, owners_tile=False)
    assert set(kube.pods()) == {"t-0-8-driver", "t-8-16-driver"} and not kube.drained
    assert phases(kube)["t-0-8"] == "Running" and phases(kube)["t-8-16"] == "Running"
    for name in ("fake-merge", "fake-child"):
        degraded = condition(kube, name, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "NotAChild"), degraded
        assert "does not name it as its successor" in degraded["message"]
    assert [e[2] for e in events].count("NotAChild") == 2, "one event each"


def test_a_merge_waits_while_a_shard_restarts_then_starts():
    """A shard that is starting or restarting (Pending, Failed) makes the request wait, not fail: its generation
    stays unobserved (MergeRejected=False, reason MergeWaiting) and the pass comes back until both run."""
    kube = two_shards()
    events: list = []
    kube.delete_pod(NS, "t-8-16-driver")  # the right shard's pod is gone: it goes Pending, then runs again
    reconcile_shard(kube, kube, NS, "t-8-16", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    assert phases(kube)["t-8-16"] == "Failed" or phases(kube)["t-8-16"] == "Pending"
    request_merge(kube, "t-0-8", "t-8-16")
    decision_seconds: list = []
    from taskshard_operator.reconcile_shard import decide_shard

    decision = decide_shard(kube, NS, "t-0-8")
    decision_seconds.append(decision.requeue_after)
    reconcile_shard(kube, kube, NS, "t-0-8", emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0))
    waiting = condition(kube, "t-0-8", "MergeRejected")
    assert (waiting["status"], waiting["reason"]) == ("False", "MergeWaiting"), waiting
    assert "waiting until t-8-16 runs again" in waiting["message"]
    left = kube.shards()["t-0-8"]
    assert left["status"]["observedGeneration"] != left["metadata"]["generation"], "the request stays undecided"
    assert decision_seconds[0] is not None and decision_seconds[0] <= 5.0, "looked at again soon"
    assert phases(kube)["t-0-8"] == "Running" and "merge" not in left["status"]
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    assert [e[2] for e in events].count("MergeWaiting") == 1
