"""The runtime's JSON log lines (spark_runtime.logs): fields, phase, batch, exceptions; and the pod env that asks
for them."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from spark_runtime import logs


@pytest.fixture(autouse=True)
def _format_restored(monkeypatch):
    """``logs.configure`` sets the process-wide format the SparkSession's JVM options follow (JSON logging adds a
    log4j option): a later test's session must not inherit a test's JSON."""
    monkeypatch.setattr(logs, "_format", logs.log_format())


def _record(message: str, *, batch: int | None = None, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    record = logging.LogRecord("taskshard.shard", logging.INFO, __file__, 1, message, (), exc_info)
    if batch is not None:
        record.batch = batch
    return record


def test_a_json_line_names_task_shard_phase_and_batch():
    formatter = logs.JsonFormatter(task="orders", shard="orders-0-64")
    logs.set_phase("running")
    line = json.loads(formatter.format(_record("batch 7: rows=10", batch=7)))
    assert line["message"] == "batch 7: rows=10" and line["batch"] == 7
    assert (line["task"], line["shard"], line["phase"], line["level"]) == ("orders", "orders-0-64", "running", "INFO")
    assert line["time"].endswith("Z") and "T" in line["time"]
    logs.set_phase("draining")
    other = json.loads(formatter.format(_record("draining")))
    assert other["phase"] == "draining" and "batch" not in other
    failed = json.loads(formatter.format(_record("failed", exc=True)))
    assert "RuntimeError: boom" in failed["exception"]
    logs.set_phase("starting")


def test_the_format_comes_from_the_flag_or_the_environment(monkeypatch):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        monkeypatch.setenv(logs.LOG_FORMAT_ENV, "json")
        assert logs.configure("INFO") == "json"
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        assert logs.configure("INFO", "plain") == "plain"
        monkeypatch.setenv(logs.LOG_FORMAT_ENV, "xml")
        with pytest.raises(ValueError, match="'xml': expected plain or json"):
            logs.configure("INFO")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_the_cli_flag_switches_the_root_logger_to_json(tmp_path, capsys):
    from spark_runtime.__main__ import main

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        args = ["--log-format", "json", "results", "--sink", str(tmp_path), "--storage", str(tmp_path)]
        assert main([*args, "--task", "t"]) == 0
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        logging.getLogger("taskshard.test").warning("hello", extra={"batch": 3})
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (line["message"], line["batch"], line["level"]) == ("hello", 3, "WARNING")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_the_operator_asks_shard_pods_for_json_logs_when_it_logs_json():
    from taskshard_operator import builders
    from tests.unit.test_operator_builders import R, spec

    def env(fmt: str) -> list[dict]:
        pod = builders.build_pod(
            task="o", shard="o-0-8", key_groups=R(0, 8), spec=spec(), template_hash="h", log_format=fmt
        )
        return pod["spec"]["containers"][0]["env"]

    assert {"name": "TASKSHARD_LOG_FORMAT", "value": "json"} in env("json")
    assert not [e for e in env("plain") if e["name"] == "TASKSHARD_LOG_FORMAT"]
