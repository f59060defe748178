"""Recovery: the shard runs as a subprocess (``python -m spark_runtime run --config``) and is SIGKILLed twice,
once at the worst moment (its batch output written, the batch not yet committed) and once at an arbitrary
moment while input streams in. Each restart with the same config resumes from the recovery log. A SIGTERM (a
pod deletion) stops it at a batch boundary with a savepoint but leaves it resumable; its children's ready
notes (a split) drain it for good (exit 0, summary in the termination-message file). The results equal
the reference: no loss, no double count, and the replayed batch rewrote the same output.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from spark_runtime.faults import KILL_AFTER_SINK_BATCH_ENV as FAULT_ENV
from spark_runtime.produce import generate_events

from .conftest import Reference, ShardProcess, children_ready, wait_progress

pytestmark = pytest.mark.spark


def test_sigkill_and_restart_resume_exactly(make_task):
    env = make_task(
        processor={"builtin": "sum", "field": "amount"},
        conf={"spark.taskshard.maxBytesPerTrigger": "8000"},
        trigger="200 milliseconds",
    )
    env.journal.mkdir(parents=True)
    shard = "orders-0-16"
    config_path = env.root / "shard.json"
    termination = env.root / "termination.log"
    # snapshotsKept 0 (spec.history.snapshots): a restart removes the savepoints of earlier stops
    config = env.config_dict(0, 16, terminationMessagePath=str(termination), snapshotsKept=0)
    config_path.write_text(json.dumps(config))
    ref = Reference("sum", "amount")
    events = list(generate_events(1500, 50, seed=9))

    def produce(chunk):
        env.produce(chunk)
        ref.add_all(chunk)

    ckpt = env.storage / env.task / "shards" / shard / "checkpoint"
    out_dir = env.sink / f"shard={shard}"

    # Run 1: killed by SIGKILL right after writing batch 1's output, before Spark commits batch 1.
    produce(events[:500])
    run1 = ShardProcess(env, config_path, "run1", {FAULT_ENV: "1"})
    code = run1.wait(timeout=240)
    assert code == -signal.SIGKILL, run1.tail()
    assert (out_dir / "_pending" / "1" / "batch-1.jsonl").exists(), run1.tail()  # run 1 held writer epoch 1
    assert not (out_dir / "batch-1.jsonl").exists(), "an uncommitted batch is written pending, never published"
    assert (ckpt / "commits" / "0").exists() and not (ckpt / "commits" / "1").exists()
    assert (ckpt / "offsets" / "1").exists(), "batch 1 was planned, so a restart must replay it"
    batch1_before = set((out_dir / "_pending" / "1" / "batch-1.jsonl").read_text().splitlines())

    # Run 2: resumes (replays batch 1), then dies by SIGKILL at an arbitrary moment while input streams in.
    run2 = ShardProcess(env, config_path, "run2")
    wait_progress(env, shard, lambda p: p["batchId"] >= 2, timeout=240)
    for i in range(500, 1000, 100):
        produce(events[i : i + 100])
        time.sleep(0.3)
    wait_progress(env, shard, lambda p: p["batchId"] >= 5, timeout=240)
    run2.kill_group()
    assert run2.wait(timeout=60) == -signal.SIGKILL
    # Batch 2 started after batch 1's commit, so batch 1 is published: the replay's file, identical.
    assert set((out_dir / "batch-1.jsonl").read_text().splitlines()) == batch1_before, "replay rewrote batch 1 alike"

    # Run 3: resumes again and stops on SIGTERM (sent to the Python process only, like PID 1): a savepoint,
    # not a final drain.
    produce(events[1000:1200])
    run3 = ShardProcess(env, config_path, "run3")
    wait_progress(env, shard, lambda p: p["positions"] == env.journal_ends(), timeout=300)
    run3.proc.send_signal(signal.SIGTERM)
    assert run3.wait(timeout=180) == 0, run3.tail()
    stopped = json.loads(termination.read_text())
    assert stopped["event"] == "stopped" and Path(stopped["manifest"]).is_file()
    assert not (env.storage / env.task / "shards" / shard / "drained.json").exists()

    # Run 4: resumes after the stop, catches up, and drains for good once its children are ready.
    produce(events[1200:])
    run4 = ShardProcess(env, config_path, "run4")
    target = env.journal_ends()
    wait_progress(env, shard, lambda p: p["positions"] == target, timeout=300)
    children_ready(env, shard, 0, 16)
    assert run4.wait(timeout=180) == 0, run4.tail()

    summary = json.loads(termination.read_text())
    assert summary["event"] == "drained" and summary["shard"] == shard
    assert summary["positions"] == target
    assert Path(summary["manifest"]).is_file()
    assert not Path(stopped["manifest"]).parent.exists(), "run 4's start pruned run 3's savepoint"
    assert "removed batch-" in (env.root / "run4.log").read_text()
    assert summary["stateRows"] == len(ref.results)
    assert env.results() == ref.results
    assert not list((out_dir / "_pending").glob("**/batch-*")), "the drain published every committed batch"
    assert "resumed after batch" in (env.root / "run2.log").read_text()
