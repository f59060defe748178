"""The shard runtime against a real Kafka broker and a real S3-compatible store (MinIO), both on loopback.

- a split under load with Kafka in and out and every checkpoint, snapshot and manifest on S3: the per-key
  results equal a plain-Python reference, the children start at the parent's committed offsets, and every
  invalid record is counted by exactly one shard (a batch whose progress event a stop cut off is recounted from
  Kafka);
- a broker restart mid-stream: nothing lost, nothing counted twice;
- a missing topic, wrong storage credentials, an unreachable bucket: a clear error naming the field, exit 3
  with a termination message for the operator, and the recovery log untouched (a fixed setup resumes exactly).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from spark_runtime.config import parse_config
from spark_runtime.problems import EXIT_ENVIRONMENT, EnvironmentProblem
from spark_runtime.results import final_results_from_records, read_lineage
from spark_runtime.shard import ShardRunner
from spark_runtime.sources import kafka_stream
from spark_runtime.storage import StorageProblem, location, s3_settings_from

pytestmark = pytest.mark.integration

MAX_KEY_GROUPS = 16


# ---------------------------------------------------------------- helpers


class Setup:
    """One task's topics and S3 prefix, and a config factory for its shards."""

    def __init__(
        self, broker: Any, minio: Any, tmp_path: Path, partitions: int = 4, processor: dict | None = None
    ) -> None:
        self.broker, self.minio, self.tmp = broker, minio, tmp_path
        self.processor = processor or {"builtin": "sum", "field": "amount"}
        tag = uuid.uuid4().hex[:8]
        self.task = f"kt-{tag}"
        self.topic_in, self.topic_out = f"in-{tag}", f"out-{tag}"
        self.prefix = f"runs/{tag}"
        broker.create_topic(self.topic_in, partitions)
        broker.create_topic(self.topic_out, 3)

    def config(self, shard: str, start: int, end: int, restore: dict | None = None, **over: Any) -> Any:
        data = {
            "task": self.task,
            "shard": shard,
            "maxKeyGroups": MAX_KEY_GROUPS,
            "keyGroups": {"start": start, "end": end},
            "processor": self.processor,
            "source": {"kafka": {"bootstrapServers": self.broker.bootstrap_servers, "topic": self.topic_in}},
            "sink": {"kafka": {"bootstrapServers": self.broker.bootstrap_servers, "topic": self.topic_out}},
            "storage": {"s3": {"bucket": self.minio.bucket, "prefix": self.prefix, "endpoint": self.minio.endpoint}},
            "spark": {
                "triggerInterval": "500 milliseconds",
                "conf": {"spark.taskshard.maxRecordsPerTrigger": "400"},
            },
            "terminationMessagePath": str(self.tmp / f"{shard}.termination"),
            "metricsPort": 0,  # several runtimes share this host: no metrics endpoint
        }
        if restore is not None:
            data["restoreFrom"] = restore
        data.update(over)
        return parse_config(data)

    def storage(self) -> Any:
        cfg = self.config("x", 0, MAX_KEY_GROUPS)
        return location(f"s3a://{self.minio.bucket}/{self.prefix}", s3_settings_from(cfg.storage.s3))

    def output(self) -> list[dict]:
        return [r.value for r in self.broker.consume_all(self.topic_out)]

    def output_records(self) -> list[Any]:
        return self.broker.consume_all(self.topic_out)


class Reference:
    """Per-key sum of ``amount`` over the valid events (the record contract)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.invalid = 0

    def add(self, events: list[dict]) -> None:
        for e in events:
            key = e.get("key")
            if (type(key) is str or type(key) is int) and type(e.get("amount")) in (int, float):
                self.sums[str(key)] += e["amount"]
            else:
                self.invalid += 1


def make_events(n: int, rng: random.Random, keys: int = 300, invalid_every: int = 97) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        if invalid_every and i % invalid_every == 5:
            out.append(
                rng.choice([{"key": 1.5, "amount": 1}, {"nokey": "x", "amount": 2}, {"key": "k1", "amount": "x"}])
            )
        elif i % 11 == 0:
            out.append({"key": rng.randrange(keys), "amount": rng.randrange(1, 50)})  # integer keys
        else:
            out.append({"key": f"k{rng.randrange(keys)}", "amount": rng.randrange(1, 50)})
    return out


class Running:
    """A :class:`ShardRunner` whose ``run()`` loop runs in a thread (as ``taskshard-shard run`` does in a pod)."""

    def __init__(self, config: Any, spark: Any) -> None:
        self.runner = ShardRunner(config, spark)
        self.summary: dict | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=config.shard, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.summary = self.runner.run(poll_interval=0.2)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def committed_positions(self) -> dict[int, int]:
        r = self.runner
        if r.query is None:
            return {}
        pos = r.positions_at(r.last_committed)
        return {int(p): int(o) for p, o in next(iter(pos.values()), {}).items()}

    def wait_for(self, predicate: Any, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise AssertionError(f"{self.runner.config.shard} failed while waiting for {what}") from self.error
            if predicate():
                return
            time.sleep(0.3)
        raise AssertionError(f"{self.runner.config.shard}: no {what} within {timeout}s")

    def wait_caught_up(self, end_offsets: dict[int, int], timeout: float = 240) -> None:
        self.wait_for(lambda: self.committed_positions() == end_offsets, f"commit of offsets {end_offsets}", timeout)

    def finish(self, *, final: bool = True, timeout: float = 180) -> dict:
        self.runner.request_drain("test", final=final)
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.runner.config.shard} did not drain within {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


def check_results(setup: Setup, ref: Reference) -> None:
    records = setup.output_records()
    values = [r.value for r in records]
    # The lineage rule (deepest shard, then highest batch) gives the reference exactly.
    results = final_results_from_records(values, read_lineage(setup.storage(), setup.task))
    assert results.keys() == ref.sums.keys()
    wrong = {k: (results[k], ref.sums[k]) for k in ref.sums if results[k] != pytest.approx(ref.sums[k])}
    assert not wrong, f"{len(wrong)} keys differ, e.g. {list(wrong.items())[:5]}"
    # Keyed by the result key, a key's updates stay in one partition in processing order: the last record per
    # key (what a compacted topic keeps) is the exact result too.
    last: dict[str, Any] = {}
    for r in records:
        assert r.key == r.value["key"]
        last[r.key] = r.value["result"]
    assert {k: pytest.approx(v) for k, v in ref.sums.items()} == last
    # Duplicates (a replayed batch written again) are identical records with the same id.
    by_id: dict[bytes, set[str]] = defaultdict(set)
    for r in records:
        by_id[r.headers["taskshard-id"]].add(json.dumps(r.value, sort_keys=True))
    assert all(len(v) == 1 for v in by_id.values()), "one id, two different records"


# ---------------------------------------------------------------- the split scenario


def test_split_with_kafka_in_and_out_and_state_on_s3(spark, kafka_broker, minio, tmp_path):
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path), random.Random(7), Reference()
    first = make_events(3000, rng)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    parent = Running(setup.config("kt-0-16", 0, 16), spark)
    parent.wait_for(lambda: parent.runner.last_committed >= 1, "two committed batches")
    # More input arrives while the parent drains: the split happens under load, mid-stream.
    second = make_events(2000, rng)
    producer = threading.Thread(target=kafka_broker.produce, args=(setup.topic_in, second))
    producer.start()
    summary = parent.finish()
    producer.join(60)
    ref.add(second)
    assert summary["event"] == "drained" and summary["manifest"].startswith(f"s3a://{minio.bucket}/{setup.prefix}/")
    manifest = location(summary["manifest"], parent.runner.s3).read_json()
    assert manifest["source"]["kind"] == "kafka" and manifest["snapshot"]["path"].startswith("s3a://")
    parent_positions = manifest["positions"][setup.topic_in]
    # Usually mid-stream (400 records per batch against a backlog); the children read whatever is left.
    print(f"parent drained at batch {manifest['batchId']}, {sum(parent_positions.values())} of 5000 records read")
    assert 0 < sum(parent_positions.values()) <= 5000
    keys_on_s3 = minio.client().list_objects(minio.bucket, f"{setup.prefix}/{setup.task}/shards/kt-0-16/")
    assert any("/checkpoint/commits/" in k for k in keys_on_s3) and any("/state/key_group=" in k for k in keys_on_s3)

    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    children = [Running(setup.config(n, a, b, restore), spark) for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))]
    for child in children:
        assert child.runner.start_positions is None or child.runner.start_positions == manifest["positions"]
    third = make_events(1000, rng)
    kafka_broker.produce(setup.topic_in, third)
    ref.add(third)
    end = kafka_broker.end_offsets(setup.topic_in)
    for child in children:
        child.wait_caught_up(end)
        # Each child started exactly at the parent's committed offsets, per partition.
        assert child.runner.restore.slices[0].manifest["positions"] == manifest["positions"]
    summaries = [child.finish() for child in children]
    check_results(setup, ref)
    # Each invalid record is counted once, by the shard owning its key group (or the null key's group).
    dead = manifest["deadLetters"] + sum(s["deadLetters"] for s in summaries)
    assert dead == ref.invalid
    # Each child read only its slice of the parent's snapshot on S3.
    for child, (a, b) in zip(children, ((0, 8), (8, 16)), strict=True):
        reports = [r.read_json() for r in child.runner.paths.restore_report_dir.iterdir()]
        assert reports and all(a <= r["keyGroup"] < b for r in reports)
        assert all(f"/key_group={r['keyGroup']}/" in f for r in reports for f in r["files"])


# ---------------------------------------------------------------- broker restart


def test_a_batch_whose_progress_was_lost_is_recounted_from_kafka(spark, kafka_broker, minio, tmp_path, monkeypatch):
    """Spark posts a batch's progress, with its observed source metrics, right after committing the batch; a
    drain's stop that lands in between loses them, and the children start after that batch. The drain recounts
    such a batch from Kafka: forget one committed batch's progress and the recount restores the same counts."""
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path), random.Random(11), Reference()
    events = make_events(2000, rng)
    kafka_broker.produce(setup.topic_in, events)
    ref.add(events)
    shard = Running(setup.config("kt-0-16", 0, 16), spark)
    shard.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    summary = shard.finish()
    assert summary["deadLetters"] == ref.invalid > 0, "the only shard counts every invalid record once"
    r = shard.runner
    counted = dict(r.progress.source_metrics)
    assert counted["rowsRead"] == len(events)
    progress = [json.loads(p.json) for p in r.query.recentProgress]
    per_batch = {
        int(d["batchId"]): {k: int(v) for k, v in d["observedMetrics"]["taskshard_source"].items()}
        for d in progress
        if d.get("numInputRows")
    }
    lost_batch = next(b for b, m in sorted(per_batch.items()) if b > 0 and m["deadLetters"] > 0)
    lost = per_batch[lost_batch]
    r.progress._seen.discard(lost_batch)  # as if the stop had come between its commit and its progress event
    for name in r.progress.source_metrics:
        r.progress.source_metrics[name] -= lost[name]
    assert not r.progress.reported(lost_batch)
    r.drainer.recount_unreported_batches()
    assert r.progress.source_metrics == counted, f"batch {lost_batch} recounted from Kafka: {lost}"
    assert r.progress.reported(lost_batch)

    # A range is read in the driver when short (kafka_stream.read_range_here), by a Spark batch query when long:
    # the same records either way.
    source, ctx = r.output.io.source, r.output.run.source_context
    start, end = r.positions_at(-1), r.positions_at(r.last_committed)
    options = source._stream_options(ctx, rangeFrom=json.dumps(start), rangeTo=json.dumps(end))
    assert kafka_stream.read_range_here(options).num_rows == len(events), "every record, valid or not"
    with monkeypatch.context() as m:
        m.setattr(kafka_stream, "READ_HERE_MAX_BYTES", 4096)
        held = []
        batch_of = kafka_stream._record_batch
        m.setattr(kafka_stream, "_record_batch", lambda *a: held.append(batch_of(*a)) or held[-1])
        assert kafka_stream.read_range_here(options) is None, "records past the byte cap: a Spark batch read"
        # Each consume asks for what fits an eighth of the cap: the driver passes its cap by one small batch, not
        # by a whole consume of the range (2,000 records here).
        record_bytes = [sum(len(x or b"") for c in ("key", "value") for x in b.column(c).to_pylist()) for b in held]
        assert held and max(record_bytes) <= 2 * (4096 // 8), record_bytes
        assert sum(b.nbytes for b in held) <= 2 * 4096
    here = source.read_range(spark, ctx, start, end)
    monkeypatch.setattr(kafka_stream, "READ_HERE_MAX_OFFSETS", 0)
    by_spark = source.read_range(spark, ctx, start, end)
    assert here.count() == by_spark.count() == len(events) - ref.invalid
    assert here.exceptAll(by_spark).count() == 0 and by_spark.exceptAll(here).count() == 0


def test_broker_restart_mid_stream_loses_and_doubles_nothing(spark, kafka_broker, minio, tmp_path):
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=3), random.Random(11), Reference()
    first = make_events(1500, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    shard = Running(setup.config("kt-0-16", 0, 16), spark)
    shard.wait_for(lambda: shard.runner.last_committed >= 0, "a committed batch")
    kafka_broker.restart(graceful=False, down_for=3)  # a crash: SIGKILL, down, back on the same port
    second = make_events(1500, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, second)
    ref.add(second)
    shard.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    summary = shard.finish()
    assert summary["event"] == "drained"
    check_results(setup, ref)
    # Counted once: the state's per-key sums equal the reference, and so do the committed positions.
    assert sum(summary["positions"][setup.topic_in].values()) == 3000


# ---------------------------------------------------------------- environment problems


def test_missing_topic_is_a_clear_error_and_the_shard_starts_once_it_exists(spark, kafka_broker, minio, tmp_path):
    setup = Setup(kafka_broker, minio, tmp_path)
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    cfg = setup.config(
        "kt-0-16", 0, 16, source={"kafka": {"bootstrapServers": kafka_broker.bootstrap_servers, "topic": missing}}
    )
    runner = ShardRunner(cfg, spark)
    with pytest.raises(EnvironmentProblem) as err:
        runner.start()
    assert err.value.reason == "TopicMissing" and err.value.field == "source.kafka.topic"
    assert f"source.kafka.topic: topic {missing!r} does not exist" in str(err.value)
    assert runner.query is None, "nothing started"
    # The sink is checked the same way.
    cfg = setup.config(
        "kt-0-16", 0, 16, sink={"kafka": {"bootstrapServers": kafka_broker.bootstrap_servers, "topic": missing}}
    )
    with pytest.raises(EnvironmentProblem, match="sink.kafka.topic: topic") as err:
        ShardRunner(cfg, spark).start()
    assert err.value.reason == "TopicMissing"
    # Once the topic exists the same shard runs (the pod's next restart).
    kafka_broker.create_topic(missing, 2)
    events = make_events(300, random.Random(3), invalid_every=0)
    kafka_broker.produce(missing, events)
    ref = Reference()
    ref.add(events)
    cfg = setup.config(
        "kt-0-16", 0, 16, source={"kafka": {"bootstrapServers": kafka_broker.bootstrap_servers, "topic": missing}}
    )
    shard = Running(cfg, spark)
    shard.wait_caught_up(kafka_broker.end_offsets(missing))
    shard.finish()
    check_results(setup, ref)


def test_unreachable_broker_names_bootstrap_servers(spark, kafka_broker, minio, tmp_path):
    from testinfra.common import free_port

    setup = Setup(kafka_broker, minio, tmp_path)
    dead = f"127.0.0.1:{free_port()}"
    cfg = setup.config("kt-0-16", 0, 16, source={"kafka": {"bootstrapServers": dead, "topic": setup.topic_in}})
    with pytest.raises(EnvironmentProblem) as err:
        ShardRunner(cfg, spark).start()
    assert err.value.reason == "KafkaUnreachable" and err.value.field == "source.kafka.bootstrapServers"
    assert dead in str(err.value)


def _run_cli(config: Any, tmp_path: Path, env: dict[str, str]) -> tuple[int, dict, str]:
    path = tmp_path / f"{config.shard}.json"
    path.write_text(json.dumps(config.to_json_dict()))
    proc = subprocess.run(
        [sys.executable, "-m", "spark_runtime", "run", "--config", str(path)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    message = json.loads(Path(config.termination_message_path).read_text())
    return proc.returncode, message, proc.stderr


def test_wrong_credentials_and_unreachable_bucket_fail_clearly_and_keep_the_recovery_log(
    spark, kafka_broker, minio, tmp_path
):
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(5), Reference()
    events = make_events(600, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, events)
    ref.add(events)
    cfg = setup.config("kt-0-16", 0, 16)
    shard = Running(cfg, spark)
    shard.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    stopped = shard.finish(final=False)  # a SIGTERM: resumable
    assert stopped["event"] == "stopped"
    checkpoint = shard.runner.paths.checkpoint
    commits_before = [c.name for c in (checkpoint / "commits").iterdir()]

    # Wrong credentials (the Secret has a bad key): exit 3, the field and the reason in the termination message.
    code, message, stderr = _run_cli(cfg, tmp_path, {"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert code == EXIT_ENVIRONMENT, stderr[-2000:]
    assert message["event"] == "failed" and message["reason"] == "StorageAccessDenied"
    assert message["field"] == "storage.s3.credentialsSecret" and minio.bucket in message["error"]
    # A bucket that does not exist, and an endpoint nobody listens on.
    from testinfra.common import free_port

    no_bucket = setup.config("kt-0-16", 0, 16, storage={"s3": {"bucket": "no-such-bucket", "endpoint": minio.endpoint}})
    with pytest.raises(StorageProblem) as err:
        ShardRunner(no_bucket, spark).start()
    assert err.value.reason == "StorageBucketMissing" and "no-such-bucket" in str(err.value)
    unreachable = setup.config(
        "kt-0-16", 0, 16, storage={"s3": {"bucket": minio.bucket, "endpoint": f"http://127.0.0.1:{free_port()}"}}
    )
    with pytest.raises(StorageProblem) as err:
        ShardRunner(unreachable, spark).start()
    assert err.value.reason == "StorageUnreachable" and err.value.field == "storage.s3.endpoint"

    # Nothing was touched: the fixed shard resumes from its recovery log and stays exact.
    assert [c.name for c in (checkpoint / "commits").iterdir()] == commits_before
    more = make_events(400, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, more)
    ref.add(more)
    resumed = Running(cfg, spark)
    resumed.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    assert resumed.finish()["event"] == "drained"
    check_results(setup, ref)


def test_cleanup_removes_exactly_the_tasks_prefix_on_s3(minio, monkeypatch):
    """``checkpointRetention: Delete`` on S3: the cleanup pod's ``remove_tree`` deletes the task's objects only."""
    from spark_runtime.storage import remove_tree

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    client, tag = minio.client(), uuid.uuid4().hex[:6]
    keep = f"cleanup-{tag}/other-task/shards/a/progress.json"
    doomed = [f"cleanup-{tag}/gone/shards/a/checkpoint/offsets/0", f"cleanup-{tag}/gone/shards/b/lineage.json"]
    for key in [keep, *doomed]:
        client.put_object(minio.bucket, key, b"{}")
    uri = remove_tree(f"s3a://{minio.bucket}/cleanup-{tag}/gone", minio.endpoint)
    assert uri == f"s3a://{minio.bucket}/cleanup-{tag}/gone"
    left = client.list_objects(minio.bucket, f"cleanup-{tag}/")
    # (pyarrow may leave an empty "directory" marker for the parent prefix: cleanup-<tag>/)
    assert [k for k in left if not k.endswith("/")] == [keep]
    assert not [k for k in left if k.startswith(f"cleanup-{tag}/gone")]
    with pytest.raises(ValueError, match="whole bucket"):
        remove_tree(f"s3a://{minio.bucket}", minio.endpoint)


def test_latest_starts_every_shard_at_the_task_creation_time(spark, kafka_broker, minio, tmp_path):
    """``startingOffsets: latest`` pinned to one instant (the operator passes the Task's creation time): a shard
    that starts later still begins exactly where its sibling did, so together they count every record after it."""
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(9), Reference()
    kafka_broker.produce(setup.topic_in, make_events(300, rng, invalid_every=0))  # before the Task: not counted
    time.sleep(1.0)
    created_ms = int(time.time() * 1000)
    time.sleep(0.5)
    after = make_events(300, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, after)
    ref.add(after)
    source = {
        "kafka": {
            "bootstrapServers": kafka_broker.bootstrap_servers,
            "topic": setup.topic_in,
            "startingOffsets": "latest",
            "startingTimestamp": created_ms,
        }
    }
    first = Running(setup.config("kt-0-8", 0, 8, source=source), spark)
    first.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    # The start was resolved once, to concrete offsets, and pinned before the first query.
    pinned = first.runner.paths.start_positions.read_json()[setup.topic_in]
    assert pinned.keys() == {"0", "1"} and all(o >= 0 for o in pinned.values())
    more = make_events(200, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, more)
    ref.add(more)
    # Started after everything above was produced: a plain "latest" would start it at the end and miss it all.
    second = Running(setup.config("kt-8-16", 8, 16, source=source), spark)
    end = kafka_broker.end_offsets(setup.topic_in)
    first.wait_caught_up(end)
    second.wait_caught_up(end)
    first.finish()
    second.finish()
    check_results(setup, ref)


def test_latest_split_before_the_first_commit_loses_nothing(spark, kafka_broker, minio, tmp_path):
    """A ``latest`` Task split before its parent committed anything (its pod was slow to start): the drain's
    manifest carries concrete offsets, the first at or after the Task's creation, not Kafka's symbolic ``-1``,
    so the children count every record produced after the Task's creation, including those produced before the
    split and between the split and their own start (a symbolic "latest" would start each child at its own end
    and skip them all)."""
    from spark_runtime.shard import ShardRunner

    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=3), random.Random(13), Reference()
    kafka_broker.produce(setup.topic_in, make_events(200, rng, invalid_every=0))  # before the Task: not counted
    before_task = kafka_broker.end_offsets(setup.topic_in)
    time.sleep(1.0)  # record timestamps: the Task is created strictly after the records above
    source = {
        "kafka": {
            "bootstrapServers": kafka_broker.bootstrap_servers,
            "topic": setup.topic_in,
            "startingOffsets": "latest",
            "startingTimestamp": int(time.time() * 1000),
        }
    }
    time.sleep(0.5)
    before_split = make_events(300, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, before_split)
    ref.add(before_split)
    parent = ShardRunner(setup.config("kt-0-16", 0, 16, source=source), spark)
    assert parent.prepare()
    summary = parent.drain()  # the split request came before the parent's first batch
    assert summary["event"] == "drained" and summary["batchId"] == -1
    manifest = location(summary["manifest"], parent.s3).read_json()
    concrete = {setup.topic_in: {str(p): o for p, o in before_task.items()}}
    assert manifest["positions"] == concrete == parent.paths.start_positions.read_json()
    between = make_events(300, rng, invalid_every=0)  # after the split, before the children start
    kafka_broker.produce(setup.topic_in, between)
    ref.add(between)
    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    children = [
        Running(setup.config(n, a, b, restore, source=source), spark)
        for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))
    ]
    end = kafka_broker.end_offsets(setup.topic_in)
    for child in children:
        child.wait_caught_up(end)
        assert child.runner.start_positions == concrete
        assert not child.runner.paths.start_positions.exists(), "a child starts at its parent's positions"
    for child in children:
        child.finish()
    check_results(setup, ref)
    assert len(ref.sums) > 100


# ---------------------------------------------------------------- key groups nested in partitions


def _nested_source(setup: Setup, partitions: int) -> dict:
    return {
        "kafka": {
            "bootstrapServers": setup.broker.bootstrap_servers,
            "topic": setup.topic_in,
            "partitionedByKey": True,
            "partitions": partitions,
        }
    }


def _own(end: dict[int, int], shard: Running) -> dict[int, int]:
    return {p: end[p] for p in shard.runner.source.read_partitions}


def test_a_key_partitioned_topic_is_read_once_through_two_splits(spark, kafka_broker, minio, tmp_path):
    """A topic keyed by the key field (the producer's default partitioner keeps one key in one partition),
    declared ``partitionedByKey``: each shard assigns only the partitions whose key-group block meets its range,
    so the rows read add up to the rows produced (read amplification 1); a split inside a block makes both
    children read that partition; results equal the reference after two splits."""
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=4), random.Random(23), Reference()
    source = _nested_source(setup, 4)  # 16 key groups: partition p holds [4p, 4p + 4)
    first = make_events(2000, rng)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    root = Running(setup.config("kt-0-16", 0, 16, source=source), spark)
    root.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    summary = root.finish()
    assert root.runner.source.read_partitions == [0, 1, 2, 3]
    assert root.runner.progress.source_metrics["rowsRead"] == len(first)

    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    left, right = (
        Running(setup.config(n, a, b, restore, source=source), spark)
        for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))
    )
    assert left.runner.source.read_partitions == [0, 1] and right.runner.source.read_partitions == [2, 3]
    second = make_events(1500, rng)
    kafka_broker.produce(setup.topic_in, second)
    ref.add(second)
    end = kafka_broker.end_offsets(setup.topic_in)
    for child in (left, right):
        child.wait_caught_up(_own(end, child))
    left_summary = left.finish()
    # Rows read by both children = rows produced after the parent's drain: every record fetched once.
    assert left.runner.progress.source_metrics["rowsRead"] + right.runner.progress.source_metrics["rowsRead"] == len(
        second
    )

    # Split [0, 8) at 2, inside partition 0's block [0, 4): both grandchildren read partition 0.
    restore = {"parent": "kt-0-8", "manifest": left_summary["manifest"]}
    grand = [
        Running(setup.config(n, a, b, restore, source=source), spark)
        for n, a, b in (("kt-0-2", 0, 2), ("kt-2-8", 2, 8))
    ]
    assert grand[0].runner.source.read_partitions == [0] and grand[1].runner.source.read_partitions == [0, 1]
    third = make_events(1000, rng)
    kafka_broker.produce(setup.topic_in, third)
    ref.add(third)
    end = kafka_broker.end_offsets(setup.topic_in)
    for shard in (*grand, right):
        shard.wait_caught_up(_own(end, shard))
    summaries = [summary, left_summary] + [s.finish() for s in (*grand, right)]
    check_results(setup, ref)
    assert sum(s["deadLetters"] for s in summaries) == ref.invalid, "each invalid record counted by one shard"


def test_a_partition_added_to_a_key_partitioned_topic_stops_the_shard(spark, kafka_broker, minio, tmp_path):
    """Adding a partition moves keys between partitions (the partitioner hashes modulo the count): a shard whose
    key groups are nested in the declared count stops with ``PartitionCountChanged`` before it writes a batch
    under the new mapping, and a restart refuses at its preflight; nothing it committed is lost."""
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(29), Reference()
    source = _nested_source(setup, 2)
    before = make_events(800, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, before)
    ref.add(before)
    shard = Running(setup.config("kt-0-16", 0, 16, source=source), spark)
    shard.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    committed = shard.runner.last_committed
    output_before = len(setup.output_records())
    kafka_broker.add_partitions(setup.topic_in, 3)
    kafka_broker.produce(setup.topic_in, make_events(600, rng, invalid_every=0))  # some land in partitions 0, 1
    shard.thread.join(120)
    assert not shard.thread.is_alive(), "the shard must stop by itself"
    problem = shard.error
    assert isinstance(problem, EnvironmentProblem), problem
    assert problem.reason == "PartitionCountChanged" and problem.field == "source.kafka.partitions"
    assert "has 3 partitions" in str(problem) and "nested in 2" in str(problem)
    from spark_runtime.checkpoint import last_committed_batch

    assert last_committed_batch(shard.runner.paths.checkpoint) == committed, "no batch under the new mapping"
    assert len(setup.output_records()) == output_before, "nothing written under the new mapping"
    # What was committed before the change is exact.
    results = final_results_from_records(setup.output(), read_lineage(setup.storage(), setup.task))
    assert results == {k: pytest.approx(v) for k, v in ref.sums.items()}
    with pytest.raises(EnvironmentProblem, match="has 3 partitions"):
        ShardRunner(setup.config("kt-0-16", 0, 16, source=source), spark).start()


# ---------------------------------------------------------------- storage identity


def test_two_tasks_of_one_name_never_share_state_on_a_bucket(spark, kafka_broker, minio, tmp_path):  # spark: S3 env
    """Same Task name in two namespaces on one bucket and prefix, and a Task re-created over retained storage
    (a new UID): the second is refused before it reads or writes anything, naming the owner; deleting it with
    ``checkpointRetention: Delete`` keeps the first Task's state; deleting the first removes it."""
    from spark_runtime.identity import StorageOwnedByAnotherTask, remove_task_state
    from spark_runtime.shard import ShardRunner

    setup = Setup(kafka_broker, minio, tmp_path, partitions=1)
    first = ShardRunner(setup.config("kt-0-16", 0, 16, namespace="team-a", taskUid="uid-a"))
    assert first.prepare()
    identity = first.paths.task_dir / "identity.json"
    assert identity.read_json()["uid"] == "uid-a"
    for namespace, uid in (("team-b", "uid-b"), ("team-a", "uid-recreated")):
        other = ShardRunner(setup.config("kt-0-16", 0, 16, namespace=namespace, taskUid=uid))
        with pytest.raises(StorageOwnedByAnotherTask, match=f"Task team-a/{setup.task} .uid uid-a"):
            other.prepare()
    task_uri = first.paths.task_dir.uri()
    assert remove_task_state(task_uri, "uid-b", minio.endpoint).startswith("kept")
    assert first.paths.lineage.exists(), "the other Task's cleanup deleted nothing"
    assert remove_task_state(task_uri, "uid-a", minio.endpoint).startswith("removed")
    assert not identity.exists() and not first.paths.lineage.exists()


# ---------------------------------------------------------------- the writer fence on S3


def test_a_second_runtime_on_s3_fences_the_first_and_results_stay_exact(spark, kafka_broker, minio, tmp_path):
    """Two runtimes on one shard config against MinIO (a zombie pod and its replacement). The later start claims
    the next writer epoch with a conditional put; the earlier runtime stops at its next batch without writing,
    the later one alone goes on, and the results are exact."""
    from spark_runtime.fencing import WriterFenced

    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(21), Reference()
    first = make_events(1200, rng)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    zombie = Running(setup.config("kt-0-16", 0, 16), spark)
    zombie.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    assert zombie.runner.fence.epoch == 1
    # The replacement's start claims epoch 2 (a conditional put on S3) before it writes anything.
    replacement = ShardRunner(setup.config("kt-0-16", 0, 16), spark)
    assert replacement.fence.claim() == 2
    assert replacement.paths.epoch(2).exists() and not replacement.paths.epoch(2).create_exclusive(b"{}")
    second = make_events(800, rng)
    kafka_broker.produce(setup.topic_in, second)
    ref.add(second)
    zombie.thread.join(240)
    assert not zombie.thread.is_alive(), "the fenced runtime must stop"
    assert isinstance(zombie.error, WriterFenced), zombie.error
    assert "epoch 1 was superseded by epoch 2" in str(zombie.error)
    assert not zombie.runner.paths.drained.exists()
    # The replacement takes over from the recovery log and alone processes the rest.
    taking_over = Running(setup.config("kt-0-16", 0, 16), spark)
    taking_over.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    summary = taking_over.finish()
    assert summary["event"] == "drained" and summary["writerEpoch"] == 3
    manifest = location(summary["manifest"], taking_over.runner.s3).read_json()
    assert manifest["writerEpoch"] == 3
    check_results(setup, ref)
    assert sum(summary["positions"][setup.topic_in].values()) == 2000


# ---------------------------------------------------------------- live metrics


def test_kafka_lag_per_partition_on_the_metrics_endpoint_equals_the_broker_s(spark, kafka_broker, minio, tmp_path):
    """The driver's ``taskshard_shard_partition_lag`` for Kafka: per partition, the broker's end offset minus the
    batch's end offset (Spark's progress, ``latestOffset - endOffset``), within one batch of what the admin
    client reports, and 0 once the shard caught up. A shard resumed on a topic with nothing new runs no batch, and
    still measures lag 0 at poll time (Spark found nothing past the committed offsets), not "unknown"."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from spark_runtime.live import Metric
    from testinfra.common import free_port

    setup, rng = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(31)
    port = free_port()
    config = setup.config("kt-0-16", 0, 16, metricsPort=port)  # 400 records per batch
    first = Running(config, spark)  # on the empty topic: Spark's first batch records the start offsets, no rows
    first.wait_for(lambda: first.runner.last_committed == 0, "the first, empty batch")
    assert first.finish(final=False)["event"] == "stopped"
    shard = Running(config, spark)  # resumed: no new record, so no batch runs, and no batch progress reports a lag

    def samples(name: str) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
        return {s.labels.get("partition", "total"): s.value for s in found}

    def scrape() -> dict[str, float]:
        return samples(Metric.PARTITION_LAG)

    def idle_lag_zero() -> bool:
        try:
            return samples(Metric.LAG) == {"total": 0.0}
        except OSError:  # run() has not bound the port yet
            return False

    try:
        shard.wait_for(idle_lag_zero, "lag 0 measured on the idle, empty topic", 120)
        assert shard.runner.last_committed == 0, "no batch ran: the lag was measured at poll time"
        events = make_events(3000, rng, invalid_every=0)
        kafka_broker.produce(setup.topic_in, events)
        end = kafka_broker.end_offsets(setup.topic_in)
        shard.wait_for(lambda: shard.runner.last_committed >= 1, "two committed batches")
        mid = scrape()
        committed = shard.committed_positions()
        broker_lag = {f"{setup.topic_in}/{p}": end[p] - committed.get(p, 0) for p in end}
        assert set(mid) == set(broker_lag), (mid, broker_lag)
        assert all(abs(mid[p] - broker_lag[p]) <= 400 for p in mid), (mid, broker_lag, "within one batch")
        assert sum(mid.values()) > 0, "a backlog of 3000 records at 400 per batch"
        shard.wait_caught_up(end)
        shard.wait_for(lambda: scrape() and all(v == 0 for v in scrape().values()), "lag 0 once caught up", 60)
    finally:
        summary = shard.finish(final=False)
    assert summary["event"] == "stopped"
