"""Two runtimes on one shard config (a zombie pod and its replacement): the later start fences the earlier one.

Runtime A runs in this process, runtimes B and C in their own (more JVMs, like more pods). B's start claims
writer epoch 2 (spark_runtime.fencing); A's next batch stops before writing anything, A cannot drain or write a
summary any more, and B alone processes the rest, until C claims epoch 3: B then ends with exit 0 and a "fenced"
summary (no restart, no fencing contest) and C goes on. The results equal the reference: nothing lost, nothing
twice.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from spark_runtime.fencing import WriterFenced
from spark_runtime.produce import generate_events
from spark_runtime.shard import ShardRunner

from .conftest import Reference, ShardProcess, wait_caught_up, wait_progress

pytestmark = pytest.mark.spark


def _wait_fenced(runner: ShardRunner, timeout: float = 240.0) -> WriterFenced:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            runner.poll()
        except WriterFenced as fenced:
            return fenced
        time.sleep(0.2)
    raise AssertionError(f"runtime A was not fenced within {timeout}s (last batch {runner.last_committed})")


def test_a_second_runtime_fences_the_first_and_results_stay_exact(make_task, shard_spark):
    env = make_task(processor={"builtin": "sum", "field": "amount"}, trigger="200 milliseconds")
    env.journal.mkdir(parents=True)
    shard = env.shard_name(0, 16)
    ref = Reference("sum", "amount")
    events = list(generate_events(900, 40, seed=14))

    def produce(chunk):
        env.produce(chunk)
        ref.add_all(chunk)

    produce(events[:300])
    a = ShardRunner(env.config(0, 16), shard_spark)
    a.start()
    assert a.fence.epoch == 1
    wait_caught_up(env, [a])
    a_last = a.last_committed
    assert a_last >= 0

    # B starts on the same config while A runs: its start claims epoch 2.
    termination = env.root / "termination-b.log"
    config_path = env.root / "shard-b.json"
    config_path.write_text(json.dumps(env.config_dict(0, 16, terminationMessagePath=str(termination))))
    b = ShardProcess(env, config_path, "b")
    try:
        epoch2 = env.storage / env.task / "shards" / shard / "epochs" / "000000000002.json"
        deadline = time.monotonic() + 240
        while not epoch2.exists() and b.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert epoch2.exists(), b.tail()

        # New input: A's next batch meets the fence before its output, and A stops for good.
        produce(events[300:600])
        fenced = _wait_fenced(a)
        assert fenced.reason == "WriterFenced" and "epoch 1 was superseded by epoch 2" in str(fenced)
        assert not a.query.isActive
        with pytest.raises(WriterFenced, match="before the drain"):
            a.drain()  # a fenced runtime writes no marker, snapshot or summary
        shard_dir = env.storage / env.task / "shards" / shard
        assert not (shard_dir / "drained.json").exists() and not (shard_dir / "drain-requested").exists()

        # B alone processes everything A never committed, and more.
        produce(events[600:750])
        wait_progress(env, shard, lambda p: p["positions"] == env.journal_ends(), timeout=300)
        assert "fenced" not in b.tail().lower()

        # C starts (epoch 3): B's next batch meets the fence, and B ends with exit 0 (event "fenced"), so a
        # kubelet would not restart it into claiming epoch 4 and fencing C in turn.
        c_termination = env.root / "termination-c.log"
        c_config = env.root / "shard-c.json"
        c_config.write_text(json.dumps(env.config_dict(0, 16, terminationMessagePath=str(c_termination))))
        c = ShardProcess(env, c_config, "c")
        epoch3 = epoch2.with_name("000000000003.json")
        while not epoch3.exists() and c.proc.poll() is None and time.monotonic() < deadline + 300:
            time.sleep(0.2)
        assert epoch3.exists(), c.tail()
        produce(events[750:])
        assert b.wait(timeout=240) == 0, b.tail()
        fenced_b = json.loads(termination.read_text())
        assert (fenced_b["event"], fenced_b["reason"], fenced_b["writerEpoch"]) == ("fenced", "WriterFenced", 2)
        wait_progress(env, shard, lambda p: p["positions"] == env.journal_ends(), timeout=300)
        c.proc.send_signal(signal.SIGTERM)
        assert c.wait(timeout=180) == 0, c.tail()
    finally:
        b.kill_group()
        if "c" in locals():
            c.kill_group()
    stopped = json.loads(c_termination.read_text())
    assert stopped["event"] == "stopped" and stopped["writerEpoch"] == 3
    assert env.results() == ref.results
