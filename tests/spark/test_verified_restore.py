"""Verified restores: a child checks its slice of the parent's snapshot against the manifest's per-key-group
files, sizes and SHA-256 before it processes anything, and refuses a snapshot that was changed after the parent
wrote it (a key-group directory removed, an extra part file, a file altered): exit 2, reason
``SnapshotMismatch``, the key group named. An intact snapshot restores as before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_runtime.produce import generate_events

from .conftest import wait_caught_up

pytestmark = pytest.mark.spark


@pytest.fixture
def drained_root(make_task, shard_spark):
    from spark_runtime.shard import ShardRunner

    env = make_task(processor={"builtin": "count"}, max_key_groups=16)
    env.produce(list(generate_events(400, 60, seed=21)))
    root = ShardRunner(env.config(0, 16), shard_spark)
    root.start()
    wait_caught_up(env, [root])
    summary = root.drain()
    manifest = json.loads(Path(summary["manifest"]).read_text())
    return env, summary, manifest


def _child(env, summary, start: int, end: int):
    from spark_runtime.shard import ShardRunner

    return ShardRunner(env.config(start, end, {"parent": "orders-0-16", "manifest": summary["manifest"]}))


def _refused(env, summary, start: int, end: int) -> str:
    from spark_runtime.snapshot import RestoreError

    with pytest.raises(RestoreError) as err:
        _child(env, summary, start, end).prepare()
    assert err.value.reason == "SnapshotMismatch"
    return str(err.value)


def test_the_manifest_lists_every_file_with_rows_and_checksum(drained_root):
    env, summary, manifest = drained_root
    snap = manifest["snapshot"]
    listed = snap["keyGroupFiles"]
    state = Path(snap["path"])
    on_disk = {d.name.split("=")[1]: {f.name for f in d.glob("*.parquet")} for d in state.glob("key_group=*")}
    assert {kg: set(g["files"]) for kg, g in listed.items()} == on_disk
    assert sum(g["rows"] for g in listed.values()) == snap["rows"] == summary["stateRows"] > 0
    assert all(len(m["sha256"]) == 64 for g in listed.values() for m in g["files"].values())


def test_a_tampered_snapshot_is_refused_with_the_key_group_named(drained_root, tmp_path):
    env, summary, manifest = drained_root
    state = Path(manifest["snapshot"]["path"])
    groups = sorted(int(kg) for kg in manifest["snapshot"]["keyGroupFiles"])
    left = [kg for kg in groups if kg < 8]
    assert left and [kg for kg in groups if kg >= 8], "both halves hold state"
    assert _child(env, summary, 0, 8).prepare(), "the intact snapshot restores"

    # A key-group directory removed (a lifecycle rule, a wrong volume): the left child refuses; the right
    # child, whose slice is intact, does not care.
    victim = state / f"key_group={left[0]}"
    shutil.move(victim, tmp_path / "moved")
    message = _refused(env, summary, 0, 8)
    assert f"key group {left[0]}" in message and "missing" in message
    assert _child(env, summary, 8, 16).prepare()
    shutil.move(tmp_path / "moved", victim)

    # An extra part file (say, from an interrupted export that was not cleaned up).
    part = next(victim.glob("*.parquet"))
    extra = victim / f"part-99999-extra{part.suffix}"
    shutil.copy(part, extra)
    message = _refused(env, summary, 0, 8)
    assert f"key group {left[0]}" in message and extra.name in message
    extra.unlink()

    # A file altered in place: same name, other bytes.
    original = part.read_bytes()
    part.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    message = _refused(env, summary, 0, 8)
    assert f"key group {left[0]}" in message and part.name in message

    # The runtime's command exits 2 and tells the operator why (the reason becomes the Degraded reason).
    config = env.config_dict(0, 8, {"parent": "orders-0-16", "manifest": summary["manifest"]})
    config_file = tmp_path / "child.json"
    config_file.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "spark_runtime", "run", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    term = json.loads(Path(config["terminationMessagePath"]).read_text())
    assert term["event"] == "failed" and term["reason"] == "SnapshotMismatch"
    assert f"key group {left[0]}" in term["error"]
    part.write_bytes(original)
    assert _child(env, summary, 0, 8).prepare(), "restored bytes restore again"
