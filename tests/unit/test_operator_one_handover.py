"""One hand-over per shard, where two hand-overs meet: a merge and a split (or two merges, or a user's merge and
the scaler's split) asked of the same shard at once never both go through, whatever order the passes run in and
however stale a pass's cache is. The right shard of a merge is claimed by its left neighbour with a patch
conditional on the right shard's resourceVersion, and the right shard's own acceptance is a status write
conditional on the same version: only one lands. Against the in-memory API and simulated world of
``fake_cluster`` (its ``converge`` also checks, at every step, that no shard has successors of two
hand-overs and no two emitting pods overlap)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import naming
from taskshard_operator.handover import related_shards
from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import reconcile_task

from .fake_cluster import (
    FakeKube,
    assert_no_overlap,
    assert_one_handover_per_shard,
    converge,
    new_world,
    phases,
    request_split,
    running_ranges,
    successor_sets,
    world_step,
)
from .operator_spec import NS, SPEC
from .test_operator_merge import MERGED, condition, request_merge, two_shards

pytestmark = pytest.mark.unit


class LaggingCache:
    """The passes' cache with the watch behind for some shards: ``shard()`` (and ``shards_of_task``) show the
    frozen copies in ``stale``; everything else is the API's current state."""

    def __init__(self, kube: FakeKube, stale: dict[str, dict[str, Any]]) -> None:
        self.kube = kube
        self.stale = stale

    def shard(self, namespace, name):
        return copy.deepcopy(self.stale[name]) if name in self.stale else self.kube.shard(namespace, name)

    def shards_of_task(self, namespace, task):
        return [self.stale.get(s["metadata"]["name"], s) for s in self.kube.shards_of_task(namespace, task)]

    def __getattr__(self, name):
        return getattr(self.kube, name)


def shard_pass(kube: FakeKube, name: str, events: list, observed: Any = None) -> None:
    reconcile_shard(
        kube, observed or kube, NS, name, emit=lambda *a: events.append(a), backoff=PodReplacementBackoff(base=0.0)
    )
    assert_one_handover_per_shard(kube)
    assert_no_overlap(running_ranges(kube))


def test_a_split_of_the_right_shard_waits_while_a_merge_claims_it():
    """The left shard accepted the merge (its claim is on the right shard); the right shard's split request, seen
    before the merged shard exists, waits instead of being accepted: no children next to the merged shard."""
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    shard_pass(kube, "t-0-8", events)
    assert phases(kube)["t-0-8"] == "MergeRequested"
    request_split(kube, "t-8-16")
    shard_pass(kube, "t-8-16", events)
    assert phases(kube)["t-8-16"] == "Running", "the split is not accepted while a merge claims the shard"
    waiting = condition(kube, "t-8-16", "SplitRejected")
    assert (waiting["status"], waiting["reason"]) == ("False", "SplitWaiting"), waiting
    assert "t-0-8 is merging with it" in waiting["message"]
    converge(kube, events)
    assert phases(kube) == {"t-0-8": "Merged", "t-8-16": "Merged", MERGED: "Running"}
    assert successor_sets(kube) == {"t-0-8": [[MERGED]], "t-8-16": [[MERGED]]}
    rejected = condition(kube, "t-8-16", "MergeRejected")
    assert rejected["status"] == "True" and "split or merge" in rejected["message"], "then refused: it merged"


def test_a_stale_cache_cannot_let_a_merge_and_a_split_both_through():
    """The right shard accepted its split; the left shard's pass still sees it Running (the watch is behind) and
    accepts the merge: its claim, conditional on the version it saw, is refused, so no merge is accepted; on fresh
    state the merge is refused for good and the split completes."""
    kube = two_shards()
    events: list = []
    stale_right = copy.deepcopy(kube.shards()["t-8-16"])
    request_split(kube, "t-8-16")
    shard_pass(kube, "t-8-16", events)
    assert phases(kube)["t-8-16"] == "SplitRequested"
    request_merge(kube, "t-0-8", "t-8-16")
    shard_pass(kube, "t-0-8", events, observed=LaggingCache(kube, {"t-8-16": stale_right}))
    assert phases(kube)["t-0-8"] == "Running", "the claim on a newer version was refused: nothing accepted"
    assert "merge" not in kube.shards()["t-0-8"].get("status", {})
    converge(kube, events)
    rejected = condition(kube, "t-0-8", "MergeRejected")
    assert rejected["status"] == "True" and "t-8-16 is SplitRequested" in rejected["message"], rejected
    assert phases(kube)["t-8-16"] == "Split" and phases(kube)["t-0-8"] == "Running"


def test_the_right_shard_with_a_stale_view_of_itself_cannot_accept_a_split_under_a_claim():
    """The claim landed on the right shard, but its own pass decides from the version before it: its status
    write is conditional on that version and refused; on fresh state the split waits."""
    kube = two_shards()
    events: list = []
    request_split(kube, "t-8-16")
    stale_right = copy.deepcopy(kube.shards()["t-8-16"])
    request_merge(kube, "t-0-8", "t-8-16")
    kube.patch_custom("taskshards", NS, "t-8-16", {"spec": {"split": None}})  # seen by the left pass: asks nothing
    shard_pass(kube, "t-0-8", events)
    assert phases(kube)["t-0-8"] == "MergeRequested"
    kube.patch_custom("taskshards", NS, "t-8-16", {"spec": {"split": {"requested": True}}})
    stale_right["metadata"]["resourceVersion"] = "1"  # a version older than the claim's
    shard_pass(kube, "t-8-16", events, observed=LaggingCache(kube, {"t-8-16": stale_right}))
    assert phases(kube)["t-8-16"] == "Running", "its write, conditional on the old version, was refused"
    shard_pass(kube, "t-8-16", events)
    assert condition(kube, "t-8-16", "SplitRejected")["reason"] == "SplitWaiting"
    converge(kube, events)
    assert phases(kube)["t-8-16"] == "Merged"


def three_shards() -> FakeKube:
    kube = new_world({**SPEC, "initialShards": 4})
    converge(kube, [])
    return kube


def test_two_merges_racing_on_a_shared_shard_never_both_go_through():
    """t-4-8 is asked to merge with t-8-12 and t-0-4 to merge with t-4-8 at the same moment, each pass deciding on
    a cache that does not show the other request: t-0-4's claim on t-4-8 is conditional on the version before
    t-4-8's request and refused; t-4-8's merge goes through, t-0-4's is refused on fresh state. Never two merged
    shards of t-4-8."""
    kube = three_shards()
    events: list = []
    before = {n: copy.deepcopy(kube.shards()[n]) for n in ("t-0-4", "t-4-8")}
    request_merge(kube, "t-0-4", "t-4-8")
    request_merge(kube, "t-4-8", "t-8-12")
    shard_pass(kube, "t-0-4", events, observed=LaggingCache(kube, {"t-4-8": before["t-4-8"]}))
    shard_pass(kube, "t-4-8", events, observed=LaggingCache(kube, {"t-0-4": before["t-0-4"]}))
    accepted = [n for n in ("t-0-4", "t-4-8") if phases(kube)[n] == "MergeRequested"]
    assert accepted == ["t-4-8"], phases(kube)
    converge(kube, events, passes=80)
    merged = [n for n, s in kube.shards().items() if "t-4-8" in [p["parent"] for p in s["spec"].get("mergeFrom") or []]]
    assert len(merged) == 1 and phases(kube)["t-4-8"] == "Merged", (merged, phases(kube))
    assert phases(kube)["t-0-4"] == "Running" and condition(kube, "t-0-4", "MergeRejected")["status"] == "True"


def test_a_merge_cannot_claim_a_shard_that_accepted_its_own_merge_unseen():
    """The other order: t-4-8 accepted its merge with t-8-12; t-0-4's merge with t-4-8 is decided on a cache that
    still shows t-4-8 Running and asking nothing: the claim, conditional on that old version, is refused."""
    kube = three_shards()
    events: list = []
    old_right = copy.deepcopy(kube.shards()["t-4-8"])
    request_merge(kube, "t-4-8", "t-8-12")
    shard_pass(kube, "t-4-8", events)
    assert phases(kube)["t-4-8"] == "MergeRequested"
    request_merge(kube, "t-0-4", "t-4-8")
    shard_pass(kube, "t-0-4", events, observed=LaggingCache(kube, {"t-4-8": old_right}))
    assert phases(kube)["t-0-4"] == "Running", "the claim on a newer version was refused"
    converge(kube, events, passes=80)
    assert phases(kube)["t-0-4"] == "Running" and phases(kube)["t-4-8"] == "Merged"
    assert condition(kube, "t-0-4", "MergeRejected")["status"] == "True"


def test_the_scalers_merge_and_a_users_split_of_one_shard_never_both_go_through():
    """spec.shards asks the scaler for one shard fewer (a merge of t-0-8 and t-8-16) while the user splits
    t-8-16, decided on a cache that is behind: one hand-over wins, the Task ends tiled and consistent."""
    kube = new_world({**SPEC, "initialShards": 2})
    converge(kube, [])
    events: list = []
    old_right = copy.deepcopy(kube.shards()["t-8-16"])
    kube.patch_custom("tasks", NS, "t", {"spec": {"shards": 1}})
    reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
    assert (kube.shards()["t-0-8"]["spec"].get("merge") or {}).get("with") == "t-8-16", "the scaler asked a merge"
    request_split(kube, "t-8-16")
    shard_pass(kube, "t-8-16", events)
    assert phases(kube)["t-8-16"] == "SplitRequested"
    shard_pass(kube, "t-0-8", events, observed=LaggingCache(kube, {"t-8-16": old_right}))
    assert phases(kube)["t-0-8"] == "Running", "the merge's claim on the split shard was refused"
    converge(kube, events, passes=100)
    owned = sorted(
        KeyGroupRange.from_label(a["keyGroups"]) for a in kube.objects[("tasks", "t")]["status"]["activeShards"]
    )
    assert owned[0].start == 0 and owned[-1].end == 16
    for a, b in zip(owned, owned[1:], strict=False):
        assert a.end == b.start, owned


def test_a_withdrawn_merge_releases_its_claim_and_the_waiting_split_runs():
    kube = two_shards()
    events: list = []
    request_merge(kube, "t-0-8", "t-8-16")
    shard_pass(kube, "t-0-8", events)
    request_split(kube, "t-8-16")
    shard_pass(kube, "t-8-16", events)
    assert condition(kube, "t-8-16", "SplitRejected")["reason"] == "SplitWaiting"
    kube.patch_custom("taskshards", NS, "t-0-8", {"spec": {"merge": None}})
    converge(kube, events)
    assert phases(kube)["t-0-8"] == "Running" and phases(kube)["t-8-16"] == "Split"


def test_every_participant_of_a_hand_over_wakes_the_others():
    """A change of one shard of a hand-over enqueues the others' passes (no phase waits for the resync): its parent
    or parents, its children or merged shard, its merge partner, and the left shard whose claim it carries."""
    kube = two_shards()
    request_merge(kube, "t-0-8", "t-8-16")
    converge(kube, [], passes=3)
    for _ in range(3):
        world_step(kube, {}, hand_over=False)
    shards = kube.shards()
    assert related_shards(shards["t-0-8"]) == {"t-8-16", MERGED}
    assert related_shards(shards["t-8-16"]) == {"t-0-8", MERGED}
    assert related_shards(shards[MERGED]) == {"t-0-8", "t-8-16"}
    kube2 = new_world()
    converge(kube2, [])
    request_split(kube2, "t-0-16")
    converge(kube2, [], passes=3)
    shards = kube2.shards()
    assert related_shards(shards["t-0-16"]) == {"t-0-8", "t-8-16"}
    assert related_shards(shards["t-0-8"]) == {"t-0-16"}
    assert naming.ANNOTATION_MERGE_LEFT  # the claim's annotation is one of the links (t-8-16 above)
