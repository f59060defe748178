"""History retention (taskshard_operator.retention): the newest retired TaskShards stay, older ones go only once
every successor ran and committed a batch of its own; in the simulated world a split parent goes, its children
stay."""

from __future__ import annotations

import time

import pytest

from taskshard_operator.retention import PRUNE_PER_PASS, prunable

from .fake_cluster import converge, new_world, phases, request_split
from .operator_spec import SPEC

pytestmark = pytest.mark.unit


def shard(name, phase, *, retired_at=None, parent=None, merge_from=(), ran=True, committed=True, deleting=False,
          live=None):  # fmt: skip
    status = {"phase": phase, **({"live": live} if live else {})}
    if retired_at:
        status["finalCheckpoint"] = {"batchId": 3, "time": retired_at}
    if ran and (parent or merge_from):
        status["lineage"] = {"parent": parent} if parent else {"parents": list(merge_from)}
    if committed is not False:
        status["lastCheckpoint"] = {"batchId": 5 if committed is True else committed}
    spec = {}
    if parent:
        spec["restoreFrom"] = {"parent": parent, "manifest": f"/s/{parent}/drained.json"}
    if merge_from:
        spec["mergeFrom"] = [{"parent": p, "manifest": f"/s/{p}/drained.json"} for p in merge_from]
    meta = {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T00:00:00Z"
    return {"metadata": meta, "spec": spec, "status": status}


def split_chain(n: int) -> list[dict]:
    """s0 split into s1 (and a sibling), s1 into s2, ...: n retired parents, the last children running."""
    out = []
    for i in range(n):
        out.append(shard(f"s{i}", "Split", retired_at=f"2026-01-01T00:00:{i:02d}Z", parent=f"s{i - 1}" if i else None))
        out.append(shard(f"x{i}", "Running", parent=f"s{i - 1}") if i else shard("x0", "Running"))
    out.append(shard(f"s{n}", "Running", parent=f"s{n - 1}"))
    return out


def test_the_newest_are_kept_and_older_ones_go_oldest_first():
    shards = split_chain(4)
    assert prunable(shards, keep=4) == []
    assert prunable(shards, keep=1) == ["s0", "s1", "s2"]
    assert prunable(shards, keep=0) == ["s0", "s1", "s2", "s3"]
    assert len(prunable(split_chain(3 * PRUNE_PER_PASS), keep=0)) == PRUNE_PER_PASS


@pytest.mark.parametrize(
    ("successor", "why"),
    [
        (dict(committed=False), "no batch of its own yet: it may still restore from the parent's snapshot"),
        (dict(ran=False), "it never ran: without the parent it would be refused as NotAChild"),
        (dict(committed=False, live={"batchId": 3, "emitting": False}), "on standby: its hand-over may be undone"),
        (dict(committed=False, live={"batchId": -1, "emitting": True}), "emitting, but no batch committed yet"),
        (dict(committed=-1), "stopped on standby (a drain evicted it): its exit reported no batch of its own"),
        (dict(committed=-1, live={"batchId": -1, "emitting": False}), "stopped on standby, live status too"),
    ],
)
def test_a_parent_stays_while_a_successor_may_still_need_it(successor, why):
    shards = [
        shard("p", "Split", retired_at="2026-01-01T00:00:00Z"),
        shard("a", "Running", parent="p"),
        shard("b", "Pending", parent="p", **successor),
    ]
    assert prunable(shards, keep=0) == [], why


def test_a_running_successor_settles_by_its_live_status():
    live = {"batchId": 7, "emitting": True}
    shards = [
        shard("p", "Split", retired_at="2026-01-01T00:00:00Z"),
        shard("a", "Running", parent="p", committed=False, live=live),
        shard("b", "Running", parent="p", committed=False, live=live),
    ]
    assert prunable(shards, keep=0) == ["p"]


def test_merged_parents_go_once_the_merged_shard_committed_and_a_retired_successor_counts_as_settled():
    shards = [
        shard("l", "Merged", retired_at="2026-01-01T00:00:01Z"),
        shard("r", "Merged", retired_at="2026-01-01T00:00:02Z"),
        shard("m", "Split", retired_at="2026-01-01T00:00:05Z", merge_from=("l", "r")),
        shard("m1", "Running", parent="m", committed=False),
        shard("m2", "Running", parent="m"),
    ]
    assert prunable(shards, keep=0) == ["l", "r"]  # m is retired itself; its own child m1 has not committed


def test_no_successor_or_already_deleting_is_left_alone():
    orphan = shard("o", "Split", retired_at="2026-01-01T00:00:00Z")
    going = shard("g", "Split", retired_at="2026-01-01T00:00:00Z", deleting=True)
    assert prunable([orphan, going, shard("c", "Running", parent="g")], keep=0) == []


def test_a_split_parent_is_deleted_in_the_simulated_world_once_its_children_committed():
    kube = new_world({**SPEC, "history": {"retiredShards": 0}})
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16", at=4)
    converge(kube, events)
    assert phases(kube) == {"t-0-16": "Split", "t-0-4": "Running", "t-4-16": "Running"}  # no commit of their own
    for child in ("t-0-4", "t-4-16"):
        kube.objects[("taskshards", child)]["status"]["lastCheckpoint"] = {"batchId": 0}
        kube._mutated()
    converge(kube, events)
    assert phases(kube) == {"t-0-4": "Running", "t-4-16": "Running"}
    assert kube.pruned == {"t-0-16"}, "its storage was pruned before its TaskShard went"
    assert "t-prune" not in kube.pods(), "the prune pod is deleted once it succeeded"
    (pruned,) = [e for e in events if e[2] == "HistoryPruned"]
    assert "t-0-16" in pruned[3] and "spec.history.retiredShards (0)" in pruned[3]
    assert "recovery logs and snapshots removed" in pruned[3]
    assert kube.objects[("tasks", "t")]["status"]["shards"] == 2


def _split_with_settled_children(spec: dict) -> tuple:
    kube = new_world({**spec, "history": {"retiredShards": 0}})
    events: list = []
    converge(kube, events)
    request_split(kube, "t-0-16", at=4)
    converge(kube, events)
    for child in ("t-0-4", "t-4-16"):
        kube.objects[("taskshards", child)]["status"]["lastCheckpoint"] = {"batchId": 0}
        kube._mutated()
    return kube, events


def test_a_retired_shard_stays_while_its_prune_pod_runs_and_a_failed_one_is_retried():
    """The TaskShard goes only after its storage: not while the prune pod runs, not when it failed (a Warning
    event, the pod deleted, the next pass starts another)."""
    from taskshard_operator.reconcile_task import reconcile_task

    from .fake_cluster import NS

    kube, events = _split_with_settled_children(SPEC)
    emit = lambda *a: events.append(a)  # noqa: E731
    reconcile_task(kube, kube, NS, "t", emit=emit)
    pod = kube.pods()["t-prune"]
    assert pod["metadata"]["annotations"]["taskshard.io/prune-shards"] == "t-0-16"
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Task", "goes with its Task"
    command = " ".join(pod["spec"]["containers"][0]["command"])
    uid = kube.objects[("tasks", "t")]["metadata"]["uid"]
    expected = f"prune_pod_main('/data/state/t', '{uid}', ['t-0-16'], None, {{'t-0-16': ['t-0-4', 't-4-16']}})"
    assert expected in command, command
    pod["status"] = {"phase": "Running"}
    reconcile_task(kube, kube, NS, "t", emit=emit)
    assert "t-0-16" in phases(kube), "kept while its storage is being pruned"
    pod["status"] = {"phase": "Failed"}
    reconcile_task(kube, kube, NS, "t", emit=emit)
    assert "t-0-16" in phases(kube) and "t-prune" not in kube.pods()
    (failed,) = [e for e in events if e[2] == "HistoryPruneFailed"]
    assert "t-0-16" in failed[3]
    converge(kube, events)
    assert "t-0-16" not in phases(kube) and kube.pruned == {"t-0-16"}


def test_storage_the_operator_cannot_mount_stays_and_says_so():
    spec = {**SPEC, "storage": {"path": "/data/state"}}
    kube, events = _split_with_settled_children(spec)
    converge(kube, events)
    assert "t-0-16" not in phases(kube) and not kube.pruned
    (pruned,) = [e for e in events if e[2] == "HistoryPruned"]
    assert "their storage directories stay: no spec.storage.volume" in pruned[3]


def test_a_shard_storage_still_needs_stays_and_its_prune_pod_is_the_clock_of_the_next_try():
    """The prune pod decides again from storage (``spark_runtime.history``): a shard it kept keeps its TaskShard;
    the pod stays ``PRUNE_RETRY_SECONDS`` after it finished, then goes with a Normal event HistoryPruneWaiting
    naming the shard and why; the next pod prunes it once storage agrees."""
    from taskshard_operator import status as st
    from taskshard_operator.retention import PRUNE_RETRY_SECONDS

    kube, events = _split_with_settled_children(SPEC)
    why = "successor t-4-16 has not committed a batch of its own (on standby, or not started)"
    kube.storage_keeps["t-0-16"] = why
    converge(kube, events)
    assert "t-0-16" in phases(kube) and not kube.pruned, "kept: its TaskShard stays"
    pod = kube.pods()["t-prune"]
    assert pod["status"]["phase"] == "Succeeded", "kept while the pod is the clock"
    assert not [e for e in events if e[2] in ("HistoryPruned", "HistoryPruneWaiting")]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated["finishedAt"] = st.rfc3339(time.time() - PRUNE_RETRY_SECONDS - 1)
    kube._mutated()
    del kube.storage_keeps["t-0-16"]
    converge(kube, events)
    (waiting,) = [e for e in events if e[2] == "HistoryPruneWaiting"]
    assert waiting[3] == f"kept (storage still needed) t-0-16: {why}", waiting
    assert "t-0-16" not in phases(kube) and kube.pruned == {"t-0-16"}, "the next pod pruned it"
    assert "t-prune" not in kube.pods()
