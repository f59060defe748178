"""A running shard's own snapshots (spark_runtime.snapshot.retention): the newest complete ones and a pre-copy in
use stay, older complete ones go at the shard's start, incomplete ones and a drained shard's are never touched; the
Task's ``spec.history.snapshots`` reaches the shard's config."""

from __future__ import annotations

import json

import pytest

from spark_runtime.config import parse_config
from spark_runtime.fencing import WriterFenced
from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.layout import ShardPaths
from spark_runtime.protocol import DEFAULT_SNAPSHOTS_KEPT
from spark_runtime.snapshot.retention import prunable_snapshots, prune_own_snapshots
from spark_runtime.storage import location
from taskshard_operator.builders import build_shard_config
from taskshard_operator.models import TaskSpec

from .operator_spec import SPEC

pytestmark = pytest.mark.unit


def test_the_newest_complete_snapshots_stay_and_older_ones_go_oldest_first():
    names = {"batch-3.1": True, "batch-9.2": True, "batch-12.4": True, "batch-12.3": True, "batch-initial.1": True}
    assert prunable_snapshots(names, 2, None) == ["batch-initial.1", "batch-3.1", "batch-9.2"]
    assert prunable_snapshots(names, 0, None) == [
        "batch-initial.1", "batch-3.1", "batch-9.2", "batch-12.3", "batch-12.4",
    ]  # fmt: skip
    assert prunable_snapshots(names, 5, None) == []


def test_a_precopy_in_use_incomplete_exports_and_other_names_are_never_pruned():
    names = {"batch-3.1": True, "batch-5.2": True, "batch-7.3": False, "batch-8": True, "notes": True, "batch-x": True}
    # batch-8 is an older runtime's name (no epoch): epoch -1 among batch 8's, still the newest batch here
    assert prunable_snapshots(names, 1, "batch-3.1") == ["batch-5.2"]
    assert prunable_snapshots(names, 0, None) == ["batch-3.1", "batch-5.2", "batch-8"]


def snapshot(paths: ShardPaths, batch: int, epoch: int, complete: bool = True) -> None:
    state = paths.state_dir(batch, epoch)
    (state / "key_group=0").mkdir()
    (state / "key_group=0" / "part-0.parquet").write_bytes(b"x")
    if complete:
        paths.manifest(batch, epoch).write_json({"batchId": batch})


def names(paths: ShardPaths) -> list[str]:
    return sorted(d.name for d in paths.snapshots.child_dirs())


def test_pruning_at_start_keeps_the_newest_and_the_precopy_and_checks_the_fence_first(tmp_path):
    paths = ShardPaths(location(str(tmp_path / "state")), "t", "t-0-8")
    for batch, epoch in ((2, 1), (4, 2), (6, 3), (8, 4)):
        snapshot(paths, batch, epoch)
    snapshot(paths, 9, 4, complete=False)  # a stop interrupted mid-export
    paths.handover_dir.mkdir()
    paths.precopy.write_json({"manifest": paths.manifest(2, 1).uri(), "batchId": 2})
    checked = []

    def fenced(what: str) -> None:
        raise WriterFenced(what)

    with pytest.raises(WriterFenced):
        prune_own_snapshots(paths, 2, fenced)
    assert len(names(paths)) == 5, "a fenced runtime removes nothing"

    assert prune_own_snapshots(paths, 2, checked.append) == ["batch-4.2"]
    assert checked == ["pruning its older snapshots"]
    assert names(paths) == ["batch-2.1", "batch-6.3", "batch-8.4", "batch-9.4"]
    assert prune_own_snapshots(paths, 2, checked.append) == [], "idempotent"

    paths.precopy.unlink()  # the hand-over ended (aborted): its pre-copy is an old snapshot like any other
    assert prune_own_snapshots(paths, 1, checked.append) == ["batch-2.1", "batch-6.3"]
    assert names(paths) == ["batch-8.4", "batch-9.4"], "an incomplete export is its writer epoch's alone"


def test_a_drained_shard_keeps_every_snapshot(tmp_path):
    paths = ShardPaths(location(str(tmp_path / "state")), "t", "t-0-8")
    for batch in (1, 2, 3):
        snapshot(paths, batch, batch)
    paths.drained.write_json({"event": "drained", "manifest": paths.manifest(1, 1).uri()})
    assert prune_own_snapshots(paths, 0, lambda what: None) == []
    assert len(names(paths)) == 3


def test_spec_history_snapshots_reaches_the_shard_config_only_when_set():
    def config(history):
        spec = TaskSpec.model_validate({**SPEC, **({"history": history} if history is not None else {})})
        built = build_shard_config(task="t", namespace="ns", shard="t-0-8", key_groups=KeyGroupRange(0, 8), spec=spec)
        return built, parse_config(json.loads(json.dumps(built)))

    built, parsed = config(None)
    assert "snapshotsKept" not in built, "unset: no change to existing shards' configs"
    assert parsed.snapshots_kept == DEFAULT_SNAPSHOTS_KEPT == 2
    built, parsed = config({"snapshots": 0})
    assert built["snapshotsKept"] == 0 and parsed.snapshots_kept == 0
    with pytest.raises(ValueError, match="snapshots"):
        TaskSpec.model_validate({**SPEC, "history": {"snapshots": -1}})
