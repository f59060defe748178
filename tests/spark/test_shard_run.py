"""One shard over the whole key-group range, looked at from several angles (one shared run):
results equal the reference, bad input goes to dead letters with reason and position while the records around
it are processed, partial lines wait for their newline, and the drain leaves a consistent snapshot + manifest.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from spark_runtime.keygroups import key_group
from spark_runtime.produce import append_lines, generate_events

from .conftest import Reference, TaskEnv, children_ready

pytestmark = pytest.mark.spark

BAD_LINES = {
    0: [
        ("{bad json", "malformed_json"),
        ('{"key": 1.5, "amount": 1}', "bad_key_type"),
        ('{"amount": 3}', "missing_key"),
        ('{"key": "k1", "amount": "x"}', "bad_field_type"),
        ("[1, 2]", "not_an_object"),
    ],
    1: [
        ('{"key": null, "amount": 1}', "null_key"),
        ('{"key": "k2"}', "missing_field"),
        ('{"key": "' + "k" * 5000 + '", "amount": 1}', "too_large"),  # the key is longer than MAX_KEY_BYTES
        ('{"key": "k4", "amount": 1, "pad": "' + "x" * (1 << 20) + '"}', "too_large"),  # over MAX_RECORD_BYTES
    ],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, shard_spark):
    """Run one sum shard over [0, 16) through three waves of input, then drain it as a split's parent does once
    its children are ready."""
    from spark_runtime.shard import ShardRunner

    env = TaskEnv(
        root=tmp_path_factory.mktemp("one-shard"),
        processor={"builtin": "sum", "field": "amount"},
        conf={"spark.taskshard.maxBytesPerTrigger": "12000"},  # several micro-batches per wave
    )
    ref = Reference("sum", "amount")
    runner = ShardRunner(env.config(0, 16), shard_spark)

    events = list(generate_events(900, 40, seed=11))
    env.produce(events[:300])
    ref.add_all(events[:300])
    # Bad lines between good ones, and an integer key (used as its decimal text).
    for p, lines in BAD_LINES.items():
        append_lines(env.journal, p, [line for line, _ in lines])
    env.produce([{"key": 12, "amount": 5}, {"key": "12", "amount": 1}])
    ref.add_all([{"key": 12, "amount": 5}, {"key": "12", "amount": 1}])
    env.produce(events[300:600])
    ref.add_all(events[300:600])
    # A partial trailing line: not admitted until its newline arrives.
    with open(env.journal / "p1.jsonl", "ab") as fh:
        fh.write(b'{"key": "k3", "amo')

    summary: dict = {}
    thread = threading.Thread(target=lambda: summary.update(runner.run(poll_interval=0.2)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    partial_end = (env.journal / "p1.jsonl").stat().st_size
    while time.monotonic() < deadline:
        prog = env.progress(runner.config.shard)
        if prog and prog["positions"] == env.journal_ends():
            break
        time.sleep(0.2)
    positions_before_newline = env.progress(runner.config.shard)["positions"]
    with open(env.journal / "p1.jsonl", "ab") as fh:
        fh.write(b'unt": 1000}\n')
    ref.add({"key": "k3", "amount": 1000})
    env.produce(events[600:])
    ref.add_all(events[600:])
    # Wait until caught up again (the runner thread polls; we only read progress.json).
    target = env.journal_ends()
    while time.monotonic() < deadline and (env.progress(runner.config.shard) or {}).get("positions") != target:
        time.sleep(0.2)
    children_ready(env, runner.config.shard, 0, 16)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the shard did not drain once its children were ready"
    return {
        "env": env,
        "ref": ref,
        "runner": runner,
        "summary": summary,
        "partial_end": partial_end,
        "positions_before_newline": positions_before_newline,
    }


def test_results_equal_reference(run):
    env, ref = run["env"], run["ref"]
    assert env.results() == ref.results
    assert ref.results["12"] == 6  # 12 and "12" are one key


def test_several_micro_batches_ran(run):
    assert run["summary"]["batchId"] >= 3


def test_dead_letters_have_reason_and_position(run):
    env = run["env"]
    files = sorted((env.sink / "_dead_letters" / "shard=orders-0-16").glob("p*.jsonl"))
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    expected = sorted((p, reason) for p, lines in BAD_LINES.items() for _, reason in lines)
    assert sorted((r["partition"], r["reason"]) for r in records) == expected, "each bad record exactly once"
    for r in records:
        data = (env.journal / f"p{r['partition']}.jsonl").read_bytes()
        line = data[r["offset"] : data.index(b"\n", r["offset"])].decode()
        kept = r["line"].removesuffix("...(truncated)")
        assert line == r["line"] or (r["reason"] == "too_large" and line.startswith(kept)), "the bad line itself"
        assert r["offset"] == 0 or data[r["offset"] - 1 : r["offset"]] == b"\n"
        assert r["shard"] == "orders-0-16" and r["detail"]
        if r["key"] is None or not r["key"].endswith("...(truncated)"):
            assert r["key_group"] == key_group(r["key"], 16)
    assert run["summary"]["deadLetters"] == len(expected)
    # File names are the byte ranges the dead letters came from.
    for f in files:
        _, start, end = f.stem.split("-")
        assert all(int(start) <= r["offset"] < int(end) for r in map(json.loads, f.read_text().splitlines()))


def test_partial_line_waits_for_its_newline(run):
    assert run["positions_before_newline"]["p1.jsonl"] < run["partial_end"]
    assert run["env"].results()["k3"] == run["ref"].results["k3"]
    # Every committed position in the recovery log is a line boundary.
    env = run["env"]
    ckpt = env.storage / "orders" / "shards" / "orders-0-16" / "checkpoint" / "offsets"
    data = {p: (env.journal / p).read_bytes() for p in ("p0.jsonl", "p1.jsonl")}
    for f in ckpt.iterdir():
        if f.name.isdigit():
            positions = json.loads(f.read_text().splitlines()[2])
            for name, pos in positions.items():
                assert pos == 0 or data[name][pos - 1 : pos] == b"\n", (f.name, name, pos)


def test_sink_records(run):
    env = run["env"]
    files = sorted((env.sink / "shard=orders-0-16").glob("batch-*.jsonl"))
    assert files
    for f in files:
        batch = int(f.stem.split("-")[1])
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert set(rec) == {"key", "key_group", "shard", "result", "batch"}
            assert rec["batch"] == batch and rec["shard"] == "orders-0-16"
            assert rec["key_group"] == key_group(rec["key"], 16)


def test_drain_summary_manifest_and_snapshot(run):
    import pyarrow.parquet as pq

    env, summary, ref = run["env"], run["summary"], run["ref"]
    assert summary["event"] == "drained"
    assert summary["positions"] == env.journal_ends()
    assert summary["stateRows"] == len(ref.results)
    manifest = json.loads(open(summary["manifest"]).read())
    assert manifest["batchId"] == summary["batchId"]
    assert manifest["keyGroups"] == {"start": 0, "end": 16}
    assert manifest["stateFormat"] == "builtin-sum/v1"
    assert manifest["stateSchema"] == "key string, value double"
    ckpt = env.storage / "orders" / "shards" / "orders-0-16" / "checkpoint"
    assert (ckpt / "commits" / str(manifest["batchId"])).exists()
    assert not (ckpt / "commits" / str(manifest["batchId"] + 1)).exists()
    # The snapshot: one directory per key group, holding exactly that group's keys and the final values.
    state = {}
    snapshots = env.storage / "orders" / "shards" / "orders-0-16" / "snapshots"
    for d in sorted(snapshots.glob("batch-*/state/key_group=*")):
        kg = int(d.name.split("=")[1])
        for f in d.glob("*.parquet"):
            for row in pq.read_table(f).to_pylist():
                assert key_group(row["key"], 16) == kg
                state[row["key"]] = row["value"]
    assert state == {k: float(v) for k, v in ref.results.items()}
    progress = env.progress("orders-0-16")
    assert progress["batchId"] == manifest["batchId"] and progress["positions"] == manifest["positions"]


def test_drained_shard_never_processes_again(run, shard_spark):
    from spark_runtime.shard import ShardRunner

    env = run["env"]
    again = ShardRunner(env.config(0, 16), shard_spark)
    assert again.run() == run["summary"]
    assert again.query is None
