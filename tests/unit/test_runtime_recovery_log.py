"""A shard whose recovery log is missing or older than the last batch the operator saw committed refuses to start
(``RecoveryLogMissing``) instead of silently starting over; the user can allow a fresh start on purpose. No Spark:
the check runs before the session starts, on the recovery log's commit files."""

from __future__ import annotations

import pytest

from spark_runtime.config import parse_config
from spark_runtime.problems import EnvironmentProblem


def runner(tmp_path, **extra):
    from spark_runtime.shard import ShardRunner

    config = {
        "task": "orders",
        "shard": "orders-0-16",
        "maxKeyGroups": 16,
        "keyGroups": {"start": 0, "end": 16},
        "processor": {"builtin": "count"},
        "source": {"journal": {"path": str(tmp_path / "journal"), "partitions": 2}},
        "sink": {"directory": {"path": str(tmp_path / "out")}},
        "storage": {"path": str(tmp_path / "state")},
        "terminationMessagePath": str(tmp_path / "termination.log"),
        **extra,
    }
    return ShardRunner(parse_config(config))


def commit(r, *batches: int) -> None:
    commits = r.paths.checkpoint / "commits"
    for b in batches:
        (commits / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_a_recovery_log_at_or_past_the_expected_batch_starts(tmp_path):
    r = runner(tmp_path, expectedBatch=2)
    commit(r, 0, 1, 2)
    r.check_recovery_log()
    r = runner(tmp_path, expectedBatch=1)
    r.check_recovery_log()


@pytest.mark.parametrize(("batches", "expected", "says"), [((), 0, "is missing"), ((0, 1, 2), 5, "ends at batch 2")])
def test_a_missing_or_older_recovery_log_is_refused(tmp_path, batches, expected, says):
    r = runner(tmp_path, expectedBatch=expected)
    commit(r, *batches)
    with pytest.raises(EnvironmentProblem) as err:
        r.prepare()
    assert err.value.reason == "RecoveryLogMissing" and err.value.field == "expectedBatch"
    message = str(err.value)
    assert says in message and f"batch {expected} was committed before" in message
    assert "taskshard.io/allow-fresh-start=true" in message
    assert not r.paths.shard_dir.exists() or not (r.paths.shard_dir / "lineage.json").exists(), "nothing written"


def test_a_fresh_start_is_allowed_on_purpose_and_a_new_shard_needs_nothing(tmp_path):
    runner(tmp_path, expectedBatch=5, allowFreshStart=True).check_recovery_log()
    runner(tmp_path).check_recovery_log()  # no batch seen yet: a new shard
    runner(tmp_path, expectedBatch=-1).check_recovery_log()  # drained or stopped before its first commit


def state_files(r, partition: int, *names: str) -> None:
    d = r.paths.checkpoint.local_path() / "state" / "0" / str(partition)
    d.mkdir(parents=True, exist_ok=True)
    for name in names:
        (d / name).write_bytes(b"")


def test_a_commit_log_ahead_of_its_state_is_refused_naming_the_batch_the_version_and_the_partitions(tmp_path):
    """Batch 3 in the commit log, but partition 1 holds state only up to version 3 (batch 2's): refused with
    ``CheckpointInconsistent`` before anything runs; every version kind counts (changelog, snapshot zip, a format
    2 unique id), and checksum files and metadata folders are not versions."""
    from spark_runtime.checkpoint import uncommitted_state
    from spark_runtime.preparation import CHECKPOINT_INCONSISTENT, check_state_committed

    r = runner(tmp_path)
    commit(r, 0, 1, 2, 3)
    state_files(r, 0, "1.changelog", "2.changelog", "3.changelog", "4.changelog", ".4.changelog.crc")
    state_files(r, 1, "1.changelog", "2.changelog", "3.zip", ".4.changelog.crc")
    (r.paths.checkpoint.local_path() / "state" / "0" / "_metadata").mkdir()
    gap = uncommitted_state(r.paths.checkpoint)
    assert gap is not None and (gap.batch, gap.version, gap.partitions) == (3, 4, ("state/0/1",))
    with pytest.raises(EnvironmentProblem) as err:
        check_state_committed(r.io)
    assert err.value.reason == CHECKPOINT_INCONSISTENT
    message = str(err.value)
    assert "batch 3" in message and "state version 4" in message and "state/0/1" in message
    assert "remove commits/3" in message

    state_files(r, 1, "4_0f3a9c.zip")
    assert uncommitted_state(r.paths.checkpoint) is None
    check_state_committed(r.io)


def test_a_query_without_state_or_without_commits_has_no_state_gap(tmp_path):
    from spark_runtime.checkpoint import uncommitted_state

    r = runner(tmp_path)
    assert uncommitted_state(r.paths.checkpoint) is None  # nothing committed, no checkpoint at all
    commit(r, 0, 1)
    assert uncommitted_state(r.paths.checkpoint) is None  # no state folder: a stateless plan
