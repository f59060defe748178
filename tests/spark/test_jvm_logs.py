"""A runtime that logs JSON has its JVM log JSON too: Spark's own lines (Spark's structured layout) and the
runtime's Python lines on the same stderr, with no plain log4j line between them. Its own process: the log layout
is fixed when the JVM starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

PLAIN_LOG4J = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR) ")
SCRIPT = """
import logging
from spark_runtime.logs import configure
configure("INFO", "json")
from spark_runtime.session import spark_session
spark = spark_session("local[1]", app_name="taskshard-jvm-logs")
spark.sparkContext.setLogLevel("INFO")
spark.range(3).count()
logging.getLogger("spark_runtime.test").info("counted")
spark.stop()
"""


def test_the_jvm_logs_json_when_the_runtime_does():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert not [line for line in lines if PLAIN_LOG4J.match(line)], "a plain log4j line"
    objects = [json.loads(line) for line in lines if line.startswith("{")]
    jvm = [o for o in objects if "msg" in o and "logger" in o]
    python = [o for o in objects if o.get("logger") == "spark_runtime.test"]
    assert jvm and {o["level"] for o in jvm} & {"INFO", "WARN"}, "no JSON line from Spark's JVM"
    assert python and python[0]["message"] == "counted"
