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
