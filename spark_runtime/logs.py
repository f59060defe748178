"""The runtime's log lines: plain text, or one JSON object per line (``--log-format json``, or
``$TASKSHARD_LOG_FORMAT=json``, which the operator sets on shard pods when it runs with ``--log-format json``).

A JSON line holds ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``, ``message``, the shard's
``task`` and ``shard`` (from ``$TASKSHARD_TASK`` / ``$TASKSHARD_SHARD``, set on every shard pod), the runner's
``phase`` (:func:`set_phase`: ``starting``, ``standby``, ``running``, ``draining``, ``stopped``) and, on lines
about one micro-batch, ``batch`` (passed as ``extra={"batch": id}``); a logged exception adds ``exception``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

__all__ = ["LOG_FORMAT_ENV", "JsonFormatter", "configure", "set_phase"]

LOG_FORMAT_ENV = "TASKSHARD_LOG_FORMAT"
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_phase = "starting"


_format = "plain"


def log_format() -> str:
    """The format :func:`configure` set (``plain`` before it ran)."""
    return _format


def set_phase(phase: str) -> None:
    """The runner's phase, added to every JSON line from now on."""
    global _phase
    _phase = phase


class JsonFormatter(logging.Formatter):
    def __init__(self, task: str | None = None, shard: str | None = None) -> None:
        super().__init__()
        self.task = task if task is not None else os.environ.get("TASKSHARD_TASK")
        self.shard = shard if shard is not None else os.environ.get("TASKSHARD_SHARD")

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        out: dict[str, Any] = {
            "time": stamp,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "phase": _phase,
        }
        if self.task:
            out["task"] = self.task
        if self.shard:
            out["shard"] = self.shard
        batch = getattr(record, "batch", None)
        if batch is not None:
            out["batch"] = batch
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


JVM_JSON_LOGGING = "-Dlog4j2.configurationFile=classpath:org/apache/spark/log4j2-json-layout.properties"
"""The JVM option that makes Spark's own log lines JSON (Spark's structured-logging layout: ``ts``, ``level``,
``msg``, ``logger``, ``context``). Spark's ``spark.log.structuredLogging.enabled`` has no effect under PySpark,
whose JVM Spark starts as a shell (plain logs by design), so the runtime names Spark's JSON layout itself."""


def configure(level: str = "INFO", fmt: str | None = None) -> str:
    """Set up the root logger on stderr; ``fmt`` ``plain`` or ``json`` (None: ``$TASKSHARD_LOG_FORMAT``, else
    plain). Returns the format used, which :func:`log_format` answers from then on (the SparkSession's JVM logs
    JSON too: :func:`spark_runtime.session.spark_session`)."""
    global _format
    fmt = (fmt or os.environ.get(LOG_FORMAT_ENV) or "plain").lower()
    if fmt not in ("plain", "json"):
        raise ValueError(f"log format {fmt!r}: expected plain or json")
    _format = fmt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    return fmt
