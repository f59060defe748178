"""No stall that looks healthy: the runtime's poll loop beats (a gauge on the metrics endpoint and a file the
driver's liveness probe tests); a running shard whose loop stopped while its endpoint answers shows NoProgress,
one whose endpoint does not answer the operator's scrapes shows MetricsUnreachable (Ready=False, Degraded=True,
the Task naming it); the liveness probe fails only on a stale heartbeat file."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace

import pytest

from spark_runtime.live import live_stats
from spark_runtime.metrics import ShardMetrics
from taskshard_operator import builders, naming
from taskshard_operator.live import Scraped

from .fake_observed import PARENT, World, add_shard, condition, decide, make_pod, running
from .test_shard_metrics import SHARD, TASK, scrape

pytestmark = pytest.mark.unit

POD_IP = "10.1.0.7"


def answered(heartbeat: float | None, *, pod_ip: str = POD_IP, stale: bool = False) -> Scraped:
    metrics = ShardMetrics(TASK, SHARD)
    if heartbeat is not None:
        metrics.beat(heartbeat)
    stats = live_stats(scrape(metrics))
    assert stats is not None and stats.heartbeat == heartbeat, "the heartbeat goes through the endpoint"
    return Scraped(stats, "2026-01-01T00:00:00Z", pod_ip, scraped_at=time.monotonic(), stale=stale)


def running_world(scraped: Scraped | None, *, scraping: bool = True) -> World:
    world = World()
    add_shard(world, PARENT, phase="Running", status={"lastCheckpoint": {"batchId": 4}})
    pod = make_pod(PARENT, phase="Running", state=running())
    pod["status"]["podIP"] = POD_IP
    world.pods[PARENT] = pod
    world.scraping_on = scraping
    if scraped is not None:
        world.scrapes[PARENT] = scraped
    return world


def shown(world: World) -> tuple[tuple[str, str], tuple[str, str], str]:
    decision = decide(world, PARENT)
    ready, degraded = condition(decision, "Ready"), condition(decision, "Degraded")
    assert ready is not None and degraded is not None
    return (ready["status"], ready["reason"]), (degraded["status"], degraded["reason"]), degraded["message"]


def test_a_poll_loop_that_stopped_while_the_endpoint_answers_shows_no_progress():
    ready, degraded, message = shown(running_world(answered(time.time() - 400)))
    assert ready == ("False", "NoProgress") and degraded == ("True", "NoProgress")
    assert "poll loop in driver pod" in message and "has not run for over 6 min" in message, message
    assert f"liveness probe restarts it after {naming.LIVENESS_STALE_MINUTES} min" in message
    ready, degraded, _ = shown(running_world(answered(time.time() - 2)))
    assert ready == ("True", "Emitting") and degraded == ("False", "Healthy")
    ready, _, _ = shown(running_world(answered(None)))
    assert ready == ("True", "Emitting"), "a runtime that has not beaten yet (or does not say) is not judged"


def test_a_driver_that_does_not_answer_its_scrapes_is_metrics_unreachable():
    ready, degraded, message = shown(running_world(None))
    assert ready == ("False", "MetricsUnreachable") and degraded == ("True", "MetricsUnreachable")
    assert f"has not answered on its metrics endpoint (http://{POD_IP}:" in message and "since it started" in message
    stale = replace(answered(time.time()), stale=True, scraped_at=time.monotonic() - 500)
    _, degraded, message = shown(running_world(stale))
    assert degraded == ("True", "MetricsUnreachable") and "since its last answer" in message, message
    _, degraded, _ = shown(running_world(answered(time.time(), pod_ip="10.1.0.99")))
    assert degraded == ("True", "MetricsUnreachable"), "an answer of the pod before does not count"
    _, degraded, _ = shown(running_world(None, scraping=False))
    assert degraded == ("False", "Healthy"), "with the scraper off nothing is judged"


def test_the_liveness_probe_fails_only_on_a_stale_heartbeat_file(tmp_path):
    beat = tmp_path / "heartbeat"
    command = [part.replace(naming.HEARTBEAT_FILE, str(beat)) for part in builders.LIVENESS_COMMAND]

    def probe() -> int:
        return subprocess.run(command, check=False).returncode

    assert probe() == 0, "no file: starting, restoring, on standby or draining"
    beat.touch()
    assert probe() == 0, "a fresh heartbeat"
    old = time.time() - naming.LIVENESS_STALE_MINUTES * 60 - 30
    os.utime(beat, (old, old))
    assert probe() != 0, "a poll loop that stopped"
