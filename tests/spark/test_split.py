"""Split and restore: a shard drained part-way hands its state to two children over the halves of its range,
one child is split again (three active shards), and the task's results equal the reference after every step:
no event lost, none counted twice. Each child reads only its key groups' snapshot files.

Runs once with the builtin (Spark's native aggregation) and once with a Python processor (the vectorized
processor API), in one shared SparkSession.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from spark_runtime.produce import generate_events

from .conftest import Reference, TaskEnv, wait_caught_up

pytestmark = pytest.mark.spark

PROCESSORS = {  # kind -> (processor, reference, sink format)
    "builtin-count": ({"builtin": "count"}, Reference("count"), "jsonl"),
    "python-sum": (
        {"python": "spark_runtime.processor:SumProcessor", "parameters": {"field": "amount"}},
        Reference("sum", "amount"),
        "parquet",
    ),
}


def task_with_reference(make_task, kind: str) -> tuple[TaskEnv, Reference, Callable[[list], None]]:
    """A 16-key-group task with processor ``kind`` (a key of :data:`PROCESSORS`), its reference model, and
    ``produce(events)``, which appends events to the task's journal and to the reference alike."""
    processor, ref_template, sink_format = PROCESSORS[kind]
    env = make_task(processor=processor, max_key_groups=16, sink_format=sink_format)
    ref = Reference(ref_template.kind, ref_template.field)

    def produce(chunk: list) -> None:
        env.produce(chunk)
        ref.add_all(chunk)

    return env, ref, produce


def restore_report(env: TaskEnv, shard: str) -> dict[int, dict]:
    d = env.storage / env.task / "shards" / shard / "restore"
    return {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in d.glob("kg-*.json")}


def snapshot_files(manifest: dict, start: int, end: int) -> set[str]:
    state = Path(manifest["snapshot"]["path"])
    return {
        str(f)
        for d in state.glob("key_group=*")
        if start <= int(d.name.split("=")[1]) < end
        for f in d.glob("*.parquet")
    }


def check_child_read_only_its_slice(env: TaskEnv, parent_manifest: dict, shard: str, start: int, end: int) -> None:
    report = restore_report(env, shard)
    state = Path(parent_manifest["snapshot"]["path"])
    assert set(report) == {kg for kg in parent_manifest["snapshot"]["keyGroups"] if start <= kg < end}
    opened = {f for r in report.values() for f in r["files"]}
    assert opened == snapshot_files(parent_manifest, start, end), "exactly the files of its key groups"
    for kg, r in report.items():
        assert all(Path(f).parent == state / f"key_group={kg}" for f in r["files"])
        assert r["bytes"] == sum(Path(f).stat().st_size for f in r["files"])
    outside = snapshot_files(parent_manifest, 0, start) | snapshot_files(parent_manifest, end, 1 << 20)
    assert not opened & outside, "no file of another key group was opened"


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_split_twice_equals_reference(kind, make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env, ref, produce = task_with_reference(make_task, kind)
    events = list(generate_events(1600, 64, seed=5))

    # Phase 1: the root shard [0, 16).
    root = ShardRunner(env.config(0, 16), shard_spark)
    produce(events[:500])
    root.start()
    wait_caught_up(env, [root])
    produce(events[500:700])  # more input arrives; the drain stops wherever the current batch ends
    root_summary = root.drain()
    root_manifest = json.loads(Path(root_summary["manifest"]).read_text())
    assert env.results() == reference_at(ref, root_manifest, env), "the parent's output at its drain positions"
    # The state map (spec.split.by: state) counts, per key group, exactly the rows the drain's export wrote.
    from spark_runtime.snapshot.export import count_state_rows

    counted = count_state_rows(shard_spark, root.config, root.plan, root.paths.checkpoint, root_summary["batchId"])
    exported = {int(kg): f["rows"] for kg, f in root_manifest["snapshot"]["keyGroupFiles"].items() if f["rows"]}
    assert counted == exported and sum(counted.values()) == root_manifest["snapshot"]["rows"] > 0

    # Phase 2: two children over the halves, restored from the root's manifest.
    restore = {"parent": "orders-0-16", "manifest": root_summary["manifest"]}
    left, right = (ShardRunner(env.config(a, b, restore), shard_spark) for a, b in [(0, 8), (8, 16)])
    left.start()
    right.start()
    produce(events[700:1000])
    wait_caught_up(env, [left, right])
    assert env.results() == ref.results
    for child, (a, b) in [(left, (0, 8)), (right, (8, 16))]:
        check_child_read_only_its_slice(env, root_manifest, child.config.shard, a, b)
    # History retention prunes the root (its recovery log and snapshots); a restart of a child (a template roll,
    # an eviction) resumes from its own recovery log and the plan it recorded, never from the pruned snapshot.
    right = restart_after_pruning(env, right, ["orders-0-16"], shard_spark)
    produce(events[1000:1100])
    wait_caught_up(env, [left, right])
    assert env.results() == ref.results, "a child restarted after its parent was pruned resumes exactly"

    # Phase 3: split the left child again: three active shards [0, 4), [4, 8), [8, 16).
    left_summary = left.drain()
    left_manifest = json.loads(Path(left_summary["manifest"]).read_text())
    restore = {"parent": "orders-0-8", "manifest": left_summary["manifest"]}
    grand = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in [(0, 4), (4, 8)]]
    for g in grand:
        g.start()
    produce(events[1100:])
    wait_caught_up(env, [*grand, right])
    for g, (a, b) in zip(grand, [(0, 4), (4, 8)], strict=True):
        check_child_read_only_its_slice(env, left_manifest, g.config.shard, a, b)
    summaries = [r.drain() for r in [*grand, right]]
    assert env.results() == ref.results
    sink_format = PROCESSORS[kind][2]
    assert list(env.sink.glob(f"shard=*/batch-*.{sink_format}")), f"the sink wrote {sink_format} files"
    # The active shards' final states partition the keys: every key in exactly one shard, rows add up.
    assert sum(s["stateRows"] for s in summaries) == len(ref.results)


def restart_after_pruning(env: TaskEnv, runner, pruned: list[str], spark):
    """Prune ``pruned`` (retired shards) as the prune pod does (its decision from storage facts: every successor
    committed a batch with a recorded restore plan, or retired), then stop ``runner`` (a successor that committed
    batches of its own) and start it again from the same config; the new runner."""
    from spark_runtime.history import prune_retired_shards
    from spark_runtime.shard import ShardRunner

    assert runner.last_committed >= 0, "retention prunes only parents whose successors committed"
    summary = prune_retired_shards(str(env.storage / env.task), None, pruned, None, {})
    assert summary.pruned == tuple(pruned), f"storage shows every successor settled: {summary}"
    for shard in pruned:
        assert not (env.storage / env.task / "shards" / shard / "snapshots").exists()
    runner.stop()
    again = ShardRunner(runner.config, spark)
    again.start()
    assert again.restore is not None and [s.parent for s in again.restore.slices] == [
        s.parent for s in runner.restore.slices
    ], "the restart keeps its restore plan (from its record)"
    return again


def reference_at(ref: Reference, manifest: dict, env: TaskEnv) -> dict:
    """The reference over exactly the journal prefix a drained shard consumed (its manifest positions)."""
    consumed = Reference(ref.kind, ref.field)
    for name, pos in manifest["positions"].items():
        data = (env.journal / name).read_bytes()[:pos]
        consumed.add_all(json.loads(line) for line in data.splitlines() if line.strip())
    return consumed.results


def test_drain_before_the_first_batch_passes_the_seed_on(make_task, shard_spark):
    """A restored child drained before it committed any batch re-exports exactly its slice of the parent."""
    import pyarrow.parquet as pq

    from spark_runtime.keygroups import key_group
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    env.produce(list(generate_events(300, 30, seed=3)))
    root = ShardRunner(env.config(0, 16), shard_spark)
    root.start()
    wait_caught_up(env, [root])
    summary = root.drain()
    child = ShardRunner(env.config(4, 12, {"parent": "orders-0-16", "manifest": summary["manifest"]}), shard_spark)
    assert child.prepare()
    child_summary = child.drain()  # never started a query
    assert child_summary["batchId"] == -1
    assert child_summary["positions"] == summary["positions"]
    manifest = json.loads(Path(child_summary["manifest"]).read_text())
    rows = {}
    for d in Path(manifest["snapshot"]["path"]).glob("key_group=*"):
        for f in d.glob("*.parquet"):
            rows.update({r["key"]: r["value"] for r in pq.read_table(f).to_pylist()})
    parent_rows = {}
    for d in Path(summary["manifest"]).parent.glob("state/key_group=*"):
        for f in d.glob("*.parquet"):
            parent_rows.update({r["key"]: r["value"] for r in pq.read_table(f).to_pylist()})
    assert rows == {k: v for k, v in parent_rows.items() if 4 <= key_group(k, 16) < 12}
