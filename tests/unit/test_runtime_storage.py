"""Storage locations (local and S3 naming), the runtime's S3 settings, Kafka positions checks, and config
combinations the runtime refuses (no Spark, no S3 service: the integration tier talks to a real one)."""

from __future__ import annotations

import json

import pytest

from spark_runtime.config import ConfigError, parse_config
from spark_runtime.storage import (
    ENV_CREDENTIALS_PROVIDER,
    S3Settings,
    StorageProblem,
    check_storage,
    location,
    s3_settings_from,
    storage_root,
)


def test_local_location_reads_writes_lists_and_deletes(tmp_path):
    root = location(tmp_path / "root")
    f = root / "a" / "b.json"
    assert not f.exists() and root.iterdir() == []
    f.write_json({"x": 1})
    assert f.is_file() and f.read_json() == {"x": 1} and (root / "a").is_dir()
    assert [c.name for c in (root / "a").iterdir()] == ["b.json"]
    assert not [p for p in (tmp_path / "root" / "a").iterdir() if p.name.startswith(".")], "no temporary left"
    f.copy_to(root / "c" / "b.json")
    assert (root / "c" / "b.json").read_text() == f.read_text()
    assert [d.name for d in root.child_dirs()] == ["a", "c"]
    f.unlink()
    f.unlink()  # missing is fine
    root.rmtree()
    assert not root.exists()
    assert str(root) == str(tmp_path / "root")
    with open(location(tmp_path) / "x", "w") as fh:  # a local location is os.PathLike
        fh.write("ok")
    assert (tmp_path / "x").read_text() == "ok"


def test_s3_uris_name_bucket_and_key_without_touching_the_network():
    loc = location("s3a://my-bucket/some/prefix/")
    assert loc.is_s3 and loc.path == "my-bucket/some/prefix" and loc.uri() == "s3a://my-bucket/some/prefix"
    assert (loc / "x.json").parent == loc and (loc / "x.json").name == "x.json"
    assert location("s3://b/k").uri() == "s3a://b/k"
    with pytest.raises(TypeError, match="on S3"):
        open(loc / "x.json")  # noqa: SIM115 - it must not be usable as a local path
    with pytest.raises(ValueError, match="needs a bucket"):
        location("s3a:///key")
    with pytest.raises(ValueError, match="unsupported scheme 'gs'"):
        location("gs://b/k")


def test_s3_settings_take_credentials_only_from_the_environment():
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_REGION": "eu-west-1"}
    spec = parse_config(_config(storage={"s3": {"bucket": "bkt", "endpoint": "http://127.0.0.1:9000"}})).storage
    s = s3_settings_from(spec.s3, env)
    assert s == S3Settings("http://127.0.0.1:9000", "eu-west-1", "AK", "SK")
    conf = s.hadoop_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert "AK" not in json.dumps(conf) and "SK" not in json.dumps(conf), "no key in the SparkConf"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == ENV_CREDENTIALS_PROVIDER
    assert "AK" not in json.dumps(s.options()) and "SK" not in json.dumps(s.options())
    assert S3Settings.from_options(s.options(), env) == s
    root = storage_root(spec, s)
    assert root.uri() == "s3a://bkt" and root.s3 == s
    no_keys = s3_settings_from(None, {})
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in no_keys.hadoop_conf(), "the AWS default chain"


def test_unreachable_s3_endpoint_is_a_storage_problem_naming_the_field():
    from testinfra.common import free_port  # a closed loopback port: nothing listens there

    settings = S3Settings(f"http://127.0.0.1:{free_port()}", "us-east-1", "AK", "SK")
    with pytest.raises(StorageProblem) as err:
        check_storage(location("s3a://bkt/prefix", settings))
    assert err.value.reason == "StorageUnreachable" and err.value.field == "storage.s3.endpoint"
    assert "storage.s3.endpoint" in str(err.value) and "bkt" in str(err.value)


def test_unwritable_local_storage_is_a_storage_problem(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageProblem) as err:
        check_storage(location(blocker / "state"))
    assert err.value.field == "storage.path" and str(blocker) in str(err.value)


def test_kafka_positions_are_checked_against_the_topic():
    from spark_runtime.sources.kafka import KafkaReader

    src = KafkaReader("127.0.0.1:9092", "orders")
    src.validate_positions({"orders": {"0": 5, "1": 0}})
    assert src.owns_offset({"orders": {"0": 5}}) and not src.owns_offset({"p0.jsonl": 3})
    with pytest.raises(ValueError, match="source.kafka.topic is 'orders'"):
        src.validate_positions({"other": {"0": 1}})
    with pytest.raises(ValueError, match="concrete Kafka offsets"):
        src.validate_positions({"orders": {"0": -7}})
    # Symbolic offsets (-2 earliest, -1 latest) mean a different record to each reader: never in a manifest.
    for symbolic in (-1, -2):
        with pytest.raises(ValueError, match=r"concrete Kafka offsets .*'1': " + str(symbolic)):
            src.validate_positions({"orders": {"0": 5, "1": symbolic}})


def test_journal_with_kafka_sink_needs_local_storage_for_dead_letters():
    pytest.importorskip("pyspark")
    from spark_runtime.shard import ShardRunner

    cfg = parse_config(
        _config(
            sink={"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "out"}},
            storage={"s3": {"bucket": "bkt"}},
        )
    )
    with pytest.raises(ConfigError, match="source.journal.*storage.path"):
        ShardRunner(cfg)


def _config(**over):
    base = {
        "task": "orders",
        "shard": "orders-0-8",
        "maxKeyGroups": 8,
        "keyGroups": {"start": 0, "end": 8},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": "/tmp/journal"}},
        "sink": {"directory": {"path": "/tmp/out"}},
        "storage": {"path": "/tmp/state"},
    }
    base.update(over)
    return base


def test_a_task_directory_belongs_to_one_task_uid(tmp_path):
    """Two Tasks of one name (two namespaces, or a Task re-created over retained storage) never share state: the
    first start claims the directory, another UID is refused naming the owner and the ways out; the cleanup of
    one Task never deletes another's state."""
    from spark_runtime.identity import StorageOwnedByAnotherTask, claim_task_storage, remove_task_state

    task_dir = location(tmp_path / "state" / "orders")
    assert claim_task_storage(task_dir, task="orders", namespace="ns-a", uid=None) is None  # no uid: no check
    assert not (tmp_path / "state" / "orders" / "identity.json").exists()
    first = claim_task_storage(task_dir, task="orders", namespace="ns-a", uid="uid-a")
    assert first["uid"] == "uid-a" and first["namespace"] == "ns-a"
    assert claim_task_storage(task_dir, task="orders", namespace="ns-a", uid="uid-a") == first  # every restart
    (tmp_path / "state" / "orders" / "shards").mkdir()
    with pytest.raises(StorageOwnedByAnotherTask) as refused:
        claim_task_storage(task_dir, task="orders", namespace="ns-b", uid="uid-b")
    problem = refused.value
    assert problem.reason == "StorageOwnedByAnotherTask" and problem.field == "storage"
    assert "Task ns-a/orders (uid uid-a" in str(problem) and "Task ns-b/orders (uid uid-b)" in str(problem)
    assert '"uid": "uid-b"' in str(problem), "says how to adopt the state on purpose"
    # Deleting ns-b/orders (checkpointRetention: Delete) keeps ns-a's state; deleting ns-a/orders removes it.
    assert remove_task_state(str(tmp_path / "state" / "orders"), "uid-b").startswith("kept")
    assert (tmp_path / "state" / "orders" / "shards").is_dir()
    assert remove_task_state(str(tmp_path / "state" / "orders"), "uid-a").startswith("removed")
    assert not (tmp_path / "state" / "orders").exists()


def test_pruning_a_retired_shard_removes_its_bulk_only_once_storage_shows_no_successor_needs_it(tmp_path):
    """History retention's prune pod (``spec.history.retiredShards``) decides from storage facts: a retired shard
    loses its bulk (recovery log, snapshots, hand-over notes, restore reports) and keeps the records the final
    results read only when every successor (the operator's and those whose ``lineage.json`` names it) retired or
    committed a batch with a recorded restore plan; otherwise it is kept, with the reason. A directory of another
    Task is left alone; a name that is not a shard's is refused; a retry finds less."""
    import json

    from spark_runtime.history import prune_pod_main, prune_retired_shards
    from spark_runtime.identity import claim_task_storage
    from spark_runtime.protocol import PruneSummary

    task_dir = tmp_path / "state" / "orders"
    shards = task_dir / "shards"
    claim_task_storage(location(task_dir), task="orders", namespace="ns", uid="uid-a")
    for shard in ("orders-0-16", "orders-0-8", "orders-lone"):
        root = shards / shard
        for bulky in ("checkpoint/commits", "snapshots/batch-3.1/state", "handover", "restore"):
            (root / bulky).mkdir(parents=True)
            (root / bulky / "f").write_text("x")
        for small in ("lineage.json", "drained.json", "progress.json"):
            (root / small).write_text("{}")
    (shards / "orders-0-8" / "lineage.json").write_text(json.dumps({"parent": "orders-0-16"}))  # it split again
    standby = shards / "orders-8-16"
    (standby / "checkpoint").mkdir(parents=True)
    (standby / "lineage.json").write_text(json.dumps({"parent": "orders-0-16", "parents": []}))
    uri, operator_view = str(task_dir), {"orders-0-16": ["orders-0-8"]}  # the operator has not seen orders-8-16

    assert prune_retired_shards(uri, "uid-b", ["orders-0-16"], None, operator_view).pruned == ()
    assert (shards / "orders-0-16" / "checkpoint").is_dir()

    kept = prune_retired_shards(uri, "uid-a", ["orders-0-16", "orders-lone"], None, operator_view)
    assert kept.pruned == () and dict(kept.kept).keys() == {"orders-0-16", "orders-lone"}, kept
    assert "successor orders-8-16 has not committed a batch of its own" in dict(kept.kept)["orders-0-16"]
    assert "no successor of orders-lone" in dict(kept.kept)["orders-lone"]
    assert (shards / "orders-0-16" / "snapshots" / "batch-3.1" / "state" / "f").exists(), "kept: nothing removed"

    (standby / "checkpoint" / "commits").mkdir()
    (standby / "checkpoint" / "commits" / "0").write_text("v1")
    why = dict(prune_retired_shards(uri, "uid-a", ["orders-0-16"], None, operator_view).kept)["orders-0-16"]
    assert "orders-8-16 committed batch 0 but recorded no restore plan" in why, why

    (standby / "restore-plan.json").write_text("{}")
    message = tmp_path / "termination-log"
    done = prune_pod_main(uri, "uid-a", ["orders-0-16"], None, operator_view, termination_log=str(message))
    assert done == PruneSummary(pruned=("orders-0-16",)), done
    assert PruneSummary.from_json(json.loads(message.read_text())) == done, "the operator reads it there"
    assert sorted(p.name for p in (shards / "orders-0-16").iterdir()) == [
        "drained.json",
        "lineage.json",
        "progress.json",
    ]
    assert (shards / "orders-0-8" / "checkpoint" / "commits" / "f").exists(), "only the named shard"
    assert prune_retired_shards(uri, "uid-a", ["orders-0-16"], None, operator_view).pruned == ("orders-0-16",)
    with pytest.raises(ValueError, match="not a shard name"):
        prune_retired_shards(uri, "uid-a", [".."])
