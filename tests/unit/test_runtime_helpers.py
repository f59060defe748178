"""Pure helpers of the shard runtime: results across a lineage, the recovery-log reader, restore checks, the
termination message, the dead-letter counter, layout, the CLI's --help without Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_runtime.checkpoint import last_committed_batch, last_planned_batch, read_offsets
from spark_runtime.layout import ShardPaths, SinkPaths, parse_snapshot_name, write_json_atomic
from spark_runtime.results import final_results, read_lineage
from spark_runtime.sink import DeadLetterCounter
from spark_runtime.snapshot import RestoreError, check_restore, load_manifest
from spark_runtime.snapshot.layout import key_group_dir, key_group_of, slice_dirs
from spark_runtime.sources.seed import parse_ddl
from spark_runtime.storage import location

pytestmark = pytest.mark.unit


def write_batch(sink, shard, batch, rows):
    path = sink / f"shard={shard}" / f"batch-{batch}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"key": k, "key_group": 0, "shard": shard, "result": v, "batch": batch}) + "\n"
            for k, v in rows.items()
        )
    )


def test_final_results_prefers_deeper_shards_and_later_batches(tmp_path):
    sink = tmp_path / "out"
    write_batch(sink, "t-0-16", 0, {"a": 1, "b": 1})
    write_batch(sink, "t-0-16", 1, {"a": 2})
    write_batch(sink, "t-0-16", 2, {"a": 99})  # after the drain's last committed batch: ignored
    write_batch(sink, "t-0-8", 0, {"a": 5})
    write_batch(sink, "t-0-4", 3, {"a": 7})
    write_batch(sink, "t-8-16", 0, {"c": 4})
    lineage = {
        "t-0-16": {"parent": None, "drainedBatch": 1},
        "t-0-8": {"parent": "t-0-16", "drainedBatch": 0},
        "t-8-16": {"parent": "t-0-16", "drainedBatch": None},
        "t-0-4": {"parent": "t-0-8", "drainedBatch": None},
    }
    assert final_results(sink, lineage=lineage) == {"a": 7, "b": 1, "c": 4}


def test_final_results_rank_a_merged_shard_below_both_parents(tmp_path):
    """A merged child is one generation deeper than the deeper of its parents, so its results win over both:
    here [4, 8) (depth 2) and [8, 16) (depth 1) merge into [4, 16) (depth 3)."""
    sink = tmp_path / "out"
    write_batch(sink, "t-0-16", 0, {"a": 1, "b": 1, "c": 1})
    write_batch(sink, "t-4-8", 5, {"b": 3})
    write_batch(sink, "t-8-16", 9, {"c": 2})
    write_batch(sink, "t-8-16", 10, {"c": 99})  # after its drain: ignored
    write_batch(sink, "t-4-16-m", 0, {"b": 4})
    write_batch(sink, "t-4-16-m", 1, {"c": 5})
    lineage = {
        "t-0-16": {"parents": [], "drainedBatch": 0},
        "t-0-8": {"parents": ["t-0-16"], "drainedBatch": 0},
        "t-8-16": {"parents": ["t-0-16"], "drainedBatch": 9},
        "t-4-8": {"parents": ["t-0-8"], "drainedBatch": 5},
        "t-4-16-m": {"parents": ["t-4-8", "t-8-16"], "drainedBatch": None},
    }
    assert final_results(sink, lineage=lineage) == {"a": 1, "b": 4, "c": 5}
    lineage["t-4-16-m"]["drainedBatch"] = 0  # drained after its batch 0: batch 1 is ignored, [8, 16)'s c stays
    assert final_results(sink, lineage=lineage) == {"a": 1, "b": 4, "c": 2}


def test_read_lineage_from_storage(tmp_path):
    paths = ShardPaths.of(tmp_path, "t", "t-0-8")
    write_json_atomic(paths.lineage, {"parent": "t-0-16", "keyGroups": {"start": 0, "end": 8}})
    write_json_atomic(paths.drained, {"batchId": 4})
    assert read_lineage(tmp_path, "t") == {
        "t-0-8": {"parent": "t-0-16", "parents": ["t-0-16"], "drainedBatch": 4, "keyGroups": {"start": 0, "end": 8}}
    }
    assert read_lineage(tmp_path, "none") == {}


def test_checkpoint_reader(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "offsets").mkdir(parents=True)
    (ckpt / "commits").mkdir()
    assert last_committed_batch(ckpt) == -1 and last_committed_batch(tmp_path / "nope") == -1
    for n in (0, 1, 2):
        (ckpt / "offsets" / str(n)).write_text(
            'v1\n{"batchWatermarkMs":0}\n{"seed": 1}\n' + json.dumps({"p0.jsonl": 10 * n}) + "\n"
        )
        (ckpt / "offsets" / f".{n}.crc").write_text("x")
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    (ckpt / "commits" / "1").write_text("v1\n{}\n")
    assert last_planned_batch(ckpt) == 2 and last_committed_batch(ckpt) == 1
    assert read_offsets(ckpt, 1) == [{"seed": 1}, {"p0.jsonl": 10}]


@pytest.fixture
def manifest():
    return {
        "version": 2,
        "task": "t",
        "shard": "t-0-16",
        "maxKeyGroups": 16,
        "keyGroups": {"start": 0, "end": 16},
        "stateFormat": "builtin-count/v1",
        "stateSchema": "key string, value bigint",
    }


def test_restore_checks(manifest, tmp_path):
    ok = dict(
        task="t",
        parent="t-0-16",
        max_key_groups=16,
        start=0,
        end=8,
        state_format="builtin-count/v1",
        state_schema="key string, value bigint",
    )
    check_restore(manifest, **ok)
    for change, message in [
        ({"task": "u"}, "belongs to task"),
        ({"parent": "t-0-8"}, "restoreFrom.parent"),
        ({"max_key_groups": 32}, "maxKeyGroups"),
        ({"end": 20}, "not inside the parent's range"),
        ({"state_format": "builtin-sum/v1"}, "state layout"),
    ]:
        with pytest.raises(RestoreError, match=message):
            check_restore(manifest, **{**ok, **change})
    with pytest.raises(RestoreError, match="has not finished draining"):
        load_manifest(tmp_path / "missing.json")
    (tmp_path / "m.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(RestoreError, match="not a version-2 manifest .version 99.*per-key-group checksums"):
        load_manifest(tmp_path / "m.json")


def test_termination_message_fits_4096_bytes():
    from spark_runtime.shard import summary_message

    small = {"event": "drained", "positions": {"p0.jsonl": 1}}
    assert json.loads(summary_message(small)) == small
    big = {"event": "drained", "positions": {f"p{i}.jsonl": 10**12 for i in range(1024)}, "manifest": "/m"}
    text = summary_message(big)
    assert len(text.encode()) <= 4096
    assert json.loads(text)["positionsOmitted"] is True and json.loads(text)["manifest"] == "/m"
    err = summary_message({"event": "failed", "error": "x" * 10000})
    assert len(err.encode()) <= 4096 and json.loads(err)["event"] == "failed"


def test_dead_letter_counter_counts_each_file_once(tmp_path):
    counter = DeadLetterCounter(tmp_path / "dl")
    assert counter.refresh() == 0
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "p0-0-10.jsonl").write_text("{}\n{}\n")
    assert counter.refresh() == 2
    (tmp_path / "dl" / "p0-0-10.jsonl").write_text("{}\n{}\n")  # a replay rewrites the same range
    (tmp_path / "dl" / ".tmp-x").write_text("{}\n")
    assert counter.refresh() == 0 and counter.total == 2


def test_layout_matches_the_contract(tmp_path):
    p = ShardPaths.of(tmp_path, "orders", "orders-0-64")
    assert Path(p.checkpoint) == tmp_path / "orders" / "shards" / "orders-0-64" / "checkpoint"
    assert p.checkpoint.uri() == str(tmp_path / "orders" / "shards" / "orders-0-64" / "checkpoint")
    snapshots = tmp_path / "orders" / "shards" / "orders-0-64" / "snapshots"
    assert Path(p.state_dir(7, 3)) == snapshots / "batch-7.3" / "state", "one directory per batch and writer epoch"
    assert Path(p.state_dir(7)) == snapshots / "batch-7" / "state", "an older runtime's"
    assert p.manifest(7, 2).name == "manifest.json" and p.manifest(-1, 2).parent.name == "batch-initial.2"
    for name, parsed in (("batch-7.3", (7, 3)), ("batch-7", (7, None)), ("batch-initial.2", (-1, 2)), ("x", None)):
        assert parse_snapshot_name(name) == parsed
    on_s3 = ShardPaths.of(location("s3a://bucket/pre/fix/"), "orders", "orders-0-64")
    assert on_s3.manifest(7, 1).uri() == (
        "s3a://bucket/pre/fix/orders/shards/orders-0-64/snapshots/batch-7.1/manifest.json"
    )
    assert p.complete_snapshots(7) == {}
    for epoch in (1, 2):
        p.state_dir(7, epoch).mkdir()
    p.manifest(7, 2).write_json({})
    assert p.complete_snapshots(7) == {2: p.manifest(7, 2)}, "a directory without a manifest is not complete"
    s = SinkPaths.of(tmp_path, "orders-0-64")
    assert s.batch_file(3, "jsonl") == tmp_path / "shard=orders-0-64" / "batch-3.jsonl"
    assert s.dead_letter_dir == tmp_path / "_dead_letters" / "shard=orders-0-64"


def test_seed_helpers(tmp_path):
    assert parse_ddl("`key` string, key_group int, `a b` double") == [
        ("key", "string"),
        ("key_group", "int"),
        ("a b", "double"),
    ]
    for kg in (1, 5, 9):
        key_group_dir(tmp_path, kg).mkdir()
    (tmp_path / "_SUCCESS").write_text("")
    (tmp_path / "key_group=x").mkdir()
    assert list(slice_dirs(tmp_path, 2, 9)) == [5]
    assert list(slice_dirs(tmp_path, 0, 10)) == [1, 5, 9]
    assert key_group_dir(tmp_path, 7).name == "key_group=7" and key_group_of("key_group=7") == 7
    assert key_group_of("key_group=x") is None and key_group_of("_SUCCESS") is None


def test_cli_help_does_not_start_spark():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from spark_runtime.__main__ import main; "
            "import contextlib, io\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('pyspark' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "run" in out and "produce" in out and out.strip().endswith("False")
    run_help = subprocess.run(
        [sys.executable, "-m", "spark_runtime", "run", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--config" in run_help


def test_cli_bad_config_exits_2_naming_the_field(tmp_path):
    cfg = tmp_path / "shard.json"
    cfg.write_text(json.dumps({"task": "t", "shard": "s", "maxKeyGroups": 0}))
    proc = subprocess.run(
        [sys.executable, "-m", "spark_runtime", "run", "--config", str(cfg)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "maxKeyGroups: 0 is invalid" in proc.stderr and "keyGroups: required field is missing" in proc.stderr
