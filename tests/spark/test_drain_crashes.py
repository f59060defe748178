"""A final drain is safe to crash in at every step: the parent shard runs as a subprocess and is killed (exit 137,
the hook ``TASKSHARD_FAULT_KILL_AT_DRAIN_STEP`` of spark_runtime.faults) after each drain step in turn (marker,
stop, mid-export, after the export, after the manifest, after the summary), each restart reaching one step
further, until the last restart reports the summary and exits 0. Each kill leaves what its step says on storage;
no restart processes anything again, replaces the manifest or the summary. Two children restore from the
manifest and the results equal the reference: nothing lost, nothing counted twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_runtime.checkpoint import last_committed_batch
from spark_runtime.faults import CRASH_EXIT_CODE, KILL_AT_DRAIN_STEP_ENV, export_in_progress
from spark_runtime.produce import generate_events
from spark_runtime.storage import location

from .conftest import Reference, ShardProcess, children_ready, wait_caught_up, wait_progress

pytestmark = pytest.mark.spark

SHARD = "orders-0-16"


def test_a_sigkill_after_each_drain_step_keeps_the_split_exact(make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env = make_task(
        processor={"builtin": "sum", "field": "amount"},
        conf={"spark.taskshard.maxBytesPerTrigger": "6000"},
        trigger="200 milliseconds",
    )
    env.journal.mkdir(parents=True)
    config_path = env.root / "shard.json"
    config_path.write_text(json.dumps(env.config_dict(0, 16)))
    termination = env.root / "termination-0-16.log"
    shard_dir = env.storage / env.task / "shards" / SHARD
    marker, drained, snapshots = shard_dir / "drain-requested", shard_dir / "drained.json", shard_dir / "snapshots"
    ref = Reference("sum", "amount")
    events = list(generate_events(800, 60, seed=43))
    chunks = iter(events[i : i + 100] for i in range(0, len(events), 100))

    def produce() -> None:
        chunk = next(chunks)
        env.produce(chunk)
        ref.add_all(chunk)

    def killed_at(step: str, run: ShardProcess) -> None:
        code = run.wait(timeout=240)
        log = run.log_path.read_text(errors="replace")
        assert code == CRASH_EXIT_CODE, f"{step}: exit {code}\n{run.tail()}"
        assert f"killed at drain step '{step}'" in log, run.tail()
        assert "started: task=" not in log or step == "marker", f"{step}: a restart started its query again"
        assert not termination.exists(), f"{step}: a killed runtime wrote no termination message"

    def run(name: str, step: str | None) -> ShardProcess:
        return ShardProcess(env, config_path, name, {KILL_AT_DRAIN_STEP_ENV: step} if step else None)

    # Run 1 processes a few batches, then its children are ready: the final drain begins and dies at step 1.
    produce()
    produce()
    run1 = run("run1-marker", "marker")
    wait_progress(env, SHARD, lambda p: p["positions"] == env.journal_ends(), timeout=240)
    produce()
    produce()
    wait_progress(env, SHARD, lambda p: p["positions"] == env.journal_ends(), timeout=240)
    children_ready(env, SHARD, 0, 16)
    killed_at("marker", run1)
    assert marker.read_text().startswith("final"), "the final drain's marker is step 1"
    assert not drained.exists() and not snapshots.exists()
    batch = last_committed_batch(shard_dir / "checkpoint")
    assert batch >= 1, run1.tail()
    positions = json.loads((shard_dir / "progress.json").read_text())["positions"]
    parent_input = dict(ref.results)  # what the parent's final positions cover: everything produced so far

    # Runs 2-6: each restart drains without starting its query (the marker says "final") and dies one step later.
    # New input meanwhile is past the parent's final positions: the children's.
    produce()
    run2 = run("run2-stopped", "stopped")
    killed_at("stopped", run2)
    assert marker.read_text().startswith("final") and not drained.exists() and not snapshots.exists()
    assert last_committed_batch(shard_dir / "checkpoint") == batch, "no batch ran after the marker"

    produce()
    run3 = run("run3-mid-export", "mid-export")
    killed_at("mid-export", run3)
    partial = snapshots / f"batch-{batch}.3" / "state"  # each writer epoch exports into a directory of its own
    assert partial.is_dir() and export_in_progress(location(partial)), "part of the state written, not all of it"
    assert not list(snapshots.glob("*/manifest.json")) and not drained.exists()

    run4 = run("run4-exported", "exported")
    killed_at("exported", run4)
    state = snapshots / f"batch-{batch}.4" / "state"
    assert (state / "_SUCCESS").exists() and list(state.glob("key_group=*/*.parquet")), "the export is complete"
    assert not (state / "_temporary").exists()
    assert all(len(list(d.glob("*.parquet"))) == 1 for d in state.glob("key_group=*")), "one export's files"
    assert export_in_progress(location(partial)), "a killed runtime's partial export is never touched by another"
    assert not list(snapshots.glob("*/manifest.json")) and not drained.exists()

    produce()
    run5 = run("run5-manifest", "manifest")
    killed_at("manifest", run5)
    manifest_path = snapshots / f"batch-{batch}.5" / "manifest.json"  # no complete snapshot yet: run 5 exports
    manifest_bytes = manifest_path.read_bytes()
    manifest = json.loads(manifest_bytes)
    assert manifest["batchId"] == batch and manifest["positions"] == positions
    assert manifest["writerEpoch"] == 5, "the manifest is the fifth runtime's (each run claims an epoch)"
    assert not drained.exists()

    run6 = run("run6-summary", "summary")
    killed_at("summary", run6)
    assert manifest_path.read_bytes() == manifest_bytes, "an existing manifest is never replaced"
    summary_bytes, summary_stat = drained.read_bytes(), drained.stat()
    summary = json.loads(summary_bytes)
    assert summary["event"] == "drained" and summary["writerEpoch"] == 6
    assert summary["manifest"] == str(manifest_path) and summary["batchId"] == batch
    assert summary["positions"] == positions and summary["handover"] == "restore"

    # Run 7, no fault: a drained shard reports its summary (exit 0) and writes nothing.
    run7 = run("run7", None)
    assert run7.wait(timeout=120) == 0, run7.tail()
    assert json.loads(termination.read_text()) == summary
    assert drained.read_bytes() == summary_bytes and drained.stat().st_mtime_ns == summary_stat.st_mtime_ns
    assert drained.stat().st_ino == summary_stat.st_ino, "drained.json was written once"
    assert manifest_path.read_bytes() == manifest_bytes
    assert [p.parent.name for p in snapshots.glob("*/manifest.json")] == [f"batch-{batch}.5"], (
        "one complete snapshot; the killed runtimes' incomplete ones (no manifest) are never read"
    )
    assert len(list((shard_dir / "epochs").iterdir())) == 6, "a drained shard claims no writer epoch"
    assert not list((env.sink / f"shard={SHARD}" / "_pending").glob("batch-*")), "committed batches published"

    # The parent's own output is exactly the input up to its final positions.
    assert env.results() == parent_input, "the parent's committed output, nothing more, nothing less"

    # Two children restore from the manifest and take over from the parent's final positions.
    restore = {"parent": SHARD, "manifest": summary["manifest"]}
    children = [ShardRunner(env.config(a, b, restore), shard_spark) for a, b in ((0, 8), (8, 16))]
    try:
        for child in children:
            child.start()
        produce()
        wait_caught_up(env, children)
    finally:
        for child in children:
            child.stop()
    assert env.results() == ref.results, "nothing lost, nothing counted twice"
    assert Path(summary["manifest"]).read_bytes() == manifest_bytes
