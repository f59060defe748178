"""The Python processor engine on Spark: the runs layout across a restart, a split and a merge while the state
schema evolves (widened, added with a default, dropped), several typed result columns, the refusal of an
incompatible schema before anything runs, and the processing-time state TTL.

One shared SparkSession; each test is one chain of shards over a 16-key-group task.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from spark_runtime.drain import wait_until
from spark_runtime.produce import generate_events

from .conftest import TaskEnv, wait_caught_up

pytestmark = pytest.mark.spark

PROFILE = "tests.spark.engine_processors:Profile"


def profile(version: object) -> dict:
    return {"python": PROFILE, "parameters": {"schema": version}}


def reference(events: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for e in events:
        r = out.setdefault(e["key"], {"count": 0, "total": 0.0})
        r["count"] += 1
        r["total"] += e["amount"]
    return out


def counts(results: dict) -> dict[str, int]:
    return {k: v["count"] for k, v in results.items()}


def recorded_schema(env: TaskEnv, shard: str) -> dict:
    return json.loads((env.storage / env.task / "shards" / shard / "state-schema.json").read_text())


def test_schema_evolves_across_a_restart_a_split_and_a_merge(make_task, shard_spark):
    from spark_runtime.engine import checkpoint_layout
    from spark_runtime.problems import TemplateRefused
    from spark_runtime.shard import ShardRunner

    env = make_task(processor=profile(1), max_key_groups=16, sink_format="parquet")
    events = list(generate_events(1200, 48, seed=9))
    env.produce(events[:400])

    # Schema 1 ("count int, total double"); results are two typed columns.
    root = ShardRunner(env.config(0, 16), shard_spark)
    root.start()
    wait_caught_up(env, [root])
    assert env.results() == reference(events[:400])
    assert checkpoint_layout(root.paths.state_layout, 0, 0).layout == "runs"
    root.stop()

    # Schema 2 widens count and adds last (default -1.0): the same checkpoint resumes, exactly.
    env.processor = profile(2)
    root = ShardRunner(env.config(0, 16), shard_spark)
    env.produce(events[400:600])
    root.start()
    wait_caught_up(env, [root])
    assert env.results() == reference(events[:600])
    assert recorded_schema(env, "orders-0-16")["columns"].startswith("count bigint, total double, last double")
    summary = root.drain()
    manifest = json.loads(Path(summary["manifest"]).read_text())
    assert manifest["stateColumns"]["columns"] == "count bigint, total double, last double default -1.0"

    # Schema 3 drops total: the split children restore the parent's schema-2 state.
    env.processor = profile(3)
    restore = {"parent": "orders-0-16", "manifest": summary["manifest"]}
    left, right = (ShardRunner(env.config(a, b, restore), shard_spark) for a, b in [(0, 8), (8, 16)])
    left.start()
    right.start()
    env.produce(events[600:900])
    wait_caught_up(env, [left, right])
    assert counts(env.results()) == counts(reference(events[:900]))
    assert recorded_schema(env, "orders-0-8")["retired"] == ["total"]

    # A merge of the two (still schema 3) is exact too.
    parents = [
        {"parent": name, "manifest": str(env.storage / env.task / "shards" / name / "drained.json")}
        for name in ("orders-0-8", "orders-8-16")
    ]
    left.drain()
    right.drain()
    merged = ShardRunner(env.config(0, 16, shard="orders-0-16-m1", mergeFrom=parents), shard_spark)
    merged.start()
    env.produce(events[900:])
    wait_caught_up(env, [merged])
    assert counts(env.results()) == counts(reference(events))
    merged.stop()

    # Re-adding the dropped column, or changing count's type to string, is refused before anything runs.
    committed = merged.last_committed
    for version, column in (("bad", "count"), (2, "total")):
        env.processor = profile(version)
        again = ShardRunner(env.config(0, 16, shard="orders-0-16-m1", mergeFrom=parents), shard_spark)
        with pytest.raises(TemplateRefused) as refused:
            again.prepare()
        assert refused.value.reason == "StateSchemaIncompatible" and f"'{column}'" in str(refused.value)
    from spark_runtime.checkpoint import last_committed_batch

    assert last_committed_batch(merged.paths.checkpoint) == committed, "nothing ran"


def ttl_reference(batches: list[tuple[int, list[str]]], ttl_ms: int) -> tuple[dict[str, int], dict[str, int]]:
    """The results and the state's last write per key of a TTL'd count over ``(batch timestamp ms, keys)``: a key
    written at ``t`` is gone from a batch at ``now >= t + ttl_ms`` on."""
    results: dict[str, int] = {}
    state: dict[str, tuple[int, int]] = {}
    for now, keys in batches:
        for key in keys:
            count, written = state.get(key, (0, now))
            count = 0 if written + ttl_ms <= now else count
            state[key] = (count + 1, now)
            results[key] = count + 1
    return results, {k: w for k, (_, w) in state.items()}


def test_state_ttl_forgets_idle_keys_in_state_and_snapshots(make_task, shard_spark):
    """The TTL runs on the batch's timestamp (the offset log's ``batchTimestampMs``): the reference is computed from
    the timestamps the batches really had. No batch runs without input (a TTL does not make the query busy)."""
    import pyarrow.parquet as pq

    from spark_runtime.checkpoint import batch_metadata
    from spark_runtime.problems import TemplateRefused
    from spark_runtime.protocol import HandoverMode
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"python": "tests.spark.engine_processors:Recent"}, max_key_groups=16)
    runner = ShardRunner(env.config(0, 16), shard_spark)
    assert runner.handover_mode == HandoverMode.RESTORE, "a successor must not re-run the records on its own clock"
    ttl_ms = 2000
    batches: list[tuple[int, list[str]]] = []
    env.produce([{"key": k} for k in ("a", "b", "a")])
    runner.start()

    def one_batch(keys: list[str]) -> int:
        before = runner.last_committed
        if batches:
            env.produce([{"key": k} for k in keys])
        wait_caught_up(env, [runner])
        assert runner.last_committed == before + 1, "one batch per input file, none without input"
        stamp = int(batch_metadata(runner.paths.checkpoint, runner.last_committed)["batchTimestampMs"])
        batches.append((stamp, keys))
        return stamp

    first = one_batch(["a", "b", "a"])
    one_batch(["b"])
    while time.time() * 1000 < first + ttl_ms + 100:  # the TTL counts the batches' clock: it has to pass
        time.sleep(0.1)
    last = one_batch(["a", "c"])
    expected, written = ttl_reference(batches, ttl_ms)
    assert expected["a"] == 1, "a's state expired (its count starts again)"
    assert env.results() == expected

    # A split child whose template cannot run on this state is refused on standby, before its ready note: the
    # parent keeps its range (refused only after the drain, both halves would be down until the template changed).
    env.processor = {"python": "tests.spark.engine_processors:RecentAsText"}
    drained = str(env.storage / env.task / "shards" / "orders-0-16" / "drained.json")
    child = ShardRunner(env.config(0, 8, {"parent": "orders-0-16", "manifest": drained}), shard_spark)
    outcome: list[BaseException] = []
    standby = threading.Thread(target=lambda: outcome.append(pytest.raises(TemplateRefused, child.prepare).value))
    standby.start()
    standby.join(timeout=60)  # a child that is not refused waits on standby for the parent's drain
    assert not standby.is_alive(), "the child went on standby (its ready note would make the parent drain)"
    (refused,) = outcome
    assert refused.reason == "StateSchemaIncompatible" and "refused before the hand-over began" in str(refused)
    handover = env.storage / env.task / "shards" / "orders-0-16" / "handover"
    assert not handover.exists() or not any(handover.iterdir()), "no request, no ready note"
    assert not runner.drain_requested(), "the parent runs on"

    summary = runner.drain()
    manifest = json.loads(Path(summary["manifest"]).read_text())
    kept = pq.read_table(manifest["snapshot"]["path"])
    live = sorted(k for k, w in written.items() if w + ttl_ms > last)
    assert "a" in live and "c" in live
    assert sorted(kept.column("key").to_pylist()) == live, "an expired key is in no snapshot"
    assert "_expires" in kept.column_names, "the expiry travels with the rows to a split's children"
    assert summary["stateRows"] == len(live)


def test_a_processor_exception_reaches_the_shard_as_the_users_error(make_task, shard_spark):
    """Not py4j's wrapper: the user's exception type and message, the call's key group and the batch."""
    from spark_runtime.keygroups import key_group
    from spark_runtime.shard import ShardFailed, ShardRunner

    env = make_task(processor={"python": "tests.spark.engine_processors:Picky"}, max_key_groups=16)
    runner = ShardRunner(env.config(0, 16), shard_spark)
    env.produce([{"key": "a", "amount": 1.0}, {"key": "b", "amount": 2.0}])
    runner.start()
    wait_caught_up(env, [runner])
    env.produce([{"key": "b", "amount": 3.0}, {"key": "c", "amount": -5.0}])
    with pytest.raises(ShardFailed) as failed:
        wait_caught_up(env, [runner])
    assert failed.value.reason == "ProcessorFailed" and failed.value.field == "processor.python"
    message = str(failed.value)
    assert message.startswith("batch 1: Picky.process raised ValueError: amount must not be negative: -5.0"), message
    groups = re.search(r"\(key groups? ([\d, ]+)\)$", message)
    assert groups and key_group("c", 16) in {int(g) for g in groups.group(1).split(", ")}, message
    assert "py4j" not in message and "Traceback" not in message
    runner.stop()


def test_a_hung_batch_shows_how_long_it_runs_then_commits_exact(make_task, shard_spark, tmp_path):
    """A processor that does not return: no commit, and the runtime's batch_running_seconds (the operator's
    NoProgress signal) grows while the batch hangs, and falls back once it commits; the results stay exact."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from spark_runtime.live import live_stats
    from spark_runtime.shard import ShardRunner

    gate = tmp_path / "gate"
    processor = {"python": "tests.spark.engine_processors:Gated", "parameters": {"gate": str(gate)}}
    env = make_task(processor=processor, max_key_groups=16)
    runner = ShardRunner(env.config(0, 16), shard_spark)
    env.produce([{"key": k} for k in ("a", "b", "a")])
    runner.start()
    try:
        wait_caught_up(env, [runner])
        committed = runner.last_committed
        gate.touch()
        env.produce([{"key": "a"}])

        def hung_for(seconds: float) -> bool:
            runner.poll()
            return runner.metrics.batch_running() >= seconds

        assert wait_until(lambda: hung_for(4.0), timeout=120), "the hung batch never showed"
        assert runner.last_committed == committed, "nothing committed while it hangs"
        text = generate_latest(runner.metrics.registry).decode()
        samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
        assert live_stats(samples).batch_running >= 4.0, "the operator reads it from the endpoint"
        gate.unlink()
        wait_caught_up(env, [runner])
        assert runner.last_committed == committed + 1
        assert runner.metrics.batch_running() < 4.0, "a commit ends the count"
        assert env.results() == {"a": 3, "b": 1}
    finally:
        gate.unlink(missing_ok=True)
        runner.stop()
