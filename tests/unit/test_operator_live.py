"""Live status (taskshard_operator.live): parsing a shard's scrape, the scraper's rounds, and how the passes mirror
it into status.live at most once per scrape (shards) and once per interval (Tasks)."""

from __future__ import annotations

import datetime as dt

from spark_runtime.live import LiveStats
from taskshard_operator.live import (
    LiveScraper,
    LiveStore,
    Scraped,
    ScrapeTarget,
    parse_scrape,
    shard_live_patch,
    task_live_patch,
)
from taskshard_operator.reconcile_task import decide_task

from .fake_observed import NS, PARENT, TASK, World, add_shard, decide, make_pod, running, sync_config

SCRAPE = """\
# HELP taskshard_shard_rows_total Input rows of committed batches.
# TYPE taskshard_shard_rows_total counter
taskshard_shard_rows_total{shard="t-0-16",task="t"} 1200.0
taskshard_shard_rows_created{shard="t-0-16",task="t"} 1.7e9
# TYPE taskshard_shard_rows_per_second gauge
taskshard_shard_rows_per_second{shard="t-0-16",task="t"} 20.04
# TYPE taskshard_shard_lag gauge
taskshard_shard_lag{shard="t-0-16",task="t",unit="bytes"} 512.0
# TYPE taskshard_shard_partition_lag gauge
taskshard_shard_partition_lag{partition="p0.jsonl",shard="t-0-16",task="t"} 500.0
taskshard_shard_partition_lag{partition="p1.jsonl",shard="t-0-16",task="t"} 12.0
# TYPE taskshard_shard_last_batch gauge
taskshard_shard_last_batch{shard="t-0-16",task="t"} 41.0
# TYPE taskshard_shard_last_batch_timestamp_seconds gauge
taskshard_shard_last_batch_timestamp_seconds{shard="t-0-16",task="t"} 1.7636e9
# TYPE taskshard_shard_batch_duration_seconds gauge
taskshard_shard_batch_duration_seconds{part="triggerExecution",shard="t-0-16",task="t"} 0.8
# TYPE taskshard_shard_state_rows gauge
taskshard_shard_state_rows{shard="t-0-16",task="t"} 300.0
# TYPE taskshard_shard_dead_letters_total counter
taskshard_shard_dead_letters_total{shard="t-0-16",task="t"} 3.0
# TYPE taskshard_shard_emitting gauge
taskshard_shard_emitting{shard="t-0-16",task="t"} 1.0
"""

STATS = LiveStats(
    batch_id=41, batch_time=1.7636e9, rate=20.04, lag=512, lag_unit="bytes", state_rows=300, dead_letters=3,
    emitting=True,
)  # fmt: skip


def test_a_scrape_parses_into_live_stats():
    assert parse_scrape(SCRAPE) == STATS
    assert parse_scrape("# nothing of a shard\nprocess_cpu_seconds_total 3.0\n") is None
    live = STATS.to_status(observed_at="2026-11-23T02:00:00Z")
    assert live == {
        "batchId": 41,
        "batchTime": "2025-11-20T00:53:20Z",
        "rate": 20.0,
        "lag": 512,
        "lagUnit": "bytes",
        "stateRows": 300,
        "deadLetters": 3,
        "emitting": True,
        "observedAt": "2026-11-23T02:00:00Z",
    }


def test_a_shard_patch_only_when_the_scrape_says_something_new():
    scraped = Scraped(STATS, "2026-11-23T02:00:10Z", "127.42.0.2")
    assert shard_live_patch(None, None) is None
    first = shard_live_patch(None, scraped)
    assert first is not None and first["batchId"] == 41
    same_later = Scraped(STATS, "2026-11-23T02:00:20Z", "127.42.0.2")
    assert shard_live_patch(first, same_later) is None, "only observedAt differs: no write"
    moved = Scraped(LiveStats(**{**STATS.__dict__, "batch_id": 42}), "2026-11-23T02:00:20Z", "127.42.0.2")
    assert shard_live_patch(first, moved)["batchId"] == 42


def test_the_task_sum_is_written_at_most_once_per_interval():
    now = dt.datetime(2026, 11, 23, 2, 0, 30, tzinfo=dt.UTC)
    lives = [
        {"rate": 10.0, "lag": 100, "lagUnit": "bytes", "deadLetters": 1},
        {"rate": 5.5, "lag": 20, "lagUnit": "bytes", "deadLetters": 0},
        None,  # a shard not reporting yet
    ]
    patch, wait = task_live_patch(None, lives, now=now)
    assert wait is None and patch == {
        "rate": 15.5, "lag": 120, "lagUnit": "bytes", "deadLetters": 1, "shardsReporting": 2,
        "observedAt": "2026-11-23T02:00:30Z",
    }  # fmt: skip
    assert task_live_patch(patch, lives, now=now + dt.timedelta(seconds=3)) == (None, None), "unchanged"
    lives[1] = {**lives[1], "rate": 7.5}
    changed_soon = task_live_patch(patch, lives, now=now + dt.timedelta(seconds=4))
    assert changed_soon[0] is None and 5.9 < changed_soon[1] <= 6.0, "a change within 10 s waits for the rest"
    later, _ = task_live_patch(patch, lives, now=now + dt.timedelta(seconds=10))
    assert later is not None and later["rate"] == 17.5
    mixed = [{"rate": 1.0, "lag": 5, "lagUnit": "records"}, {"rate": 1.0, "lag": 7, "lagUnit": "bytes"}]
    summed, _ = task_live_patch(None, mixed, now=now)
    assert "lag" not in summed, "records and bytes do not add up"
    assert task_live_patch(None, [None], now=now) == (None, None)


def test_a_scrape_round_stores_answers_and_enqueues_only_shards_whose_status_changes():
    targets = [ScrapeTarget(NS, "a", "127.42.0.2"), ScrapeTarget(NS, "b", "127.42.0.3"), ScrapeTarget(NS, "c", "x")]
    answers = {"127.42.0.2": SCRAPE, "127.42.0.3": SCRAPE}
    current = {"b": STATS.to_status(observed_at="earlier")}
    enqueued, outcomes = [], []

    def fetch(target, timeout):
        if target.pod_ip not in answers:
            raise ConnectionRefusedError("not listening yet")
        return answers[target.pod_ip]

    store = LiveStore()
    store.put(NS, "gone", Scraped(STATS, "long ago", "127.42.0.9"))
    scraper = LiveScraper(
        store, lambda: targets, lambda ns, s: current.get(s), enqueued.append, observe=outcomes.append, fetch=fetch
    )
    try:
        assert scraper.scrape_all() == 1
    finally:
        scraper.stop()
    assert enqueued == [("shard", NS, "a")], "b's status already says the same; c did not answer"
    assert sorted(outcomes) == ["error", "ok", "ok"]
    assert store.get(NS, "a").stats == STATS and store.get(NS, "c") is None
    assert store.get(NS, "gone") is None, "a shard no longer scraped is forgotten"


def _running_shard(world: World, ip: str = "127.42.0.2") -> None:
    add_shard(world, PARENT, phase="Running", status={"pod": f"{PARENT}-driver"})
    pod = make_pod(PARENT, phase="Running", state=running())
    pod["status"]["podIP"] = ip
    world.pods[PARENT] = pod
    sync_config(world, PARENT)


def test_a_running_shard_mirrors_its_scrape_into_status_live_in_its_one_write():
    world = World()
    _running_shard(world)
    assert "live" not in decide(world, PARENT).status, "no scrape yet: nothing to mirror"
    world.scrapes[PARENT] = Scraped(STATS, "2026-11-23T02:00:10Z", "127.42.0.2")
    decision = decide(world, PARENT)
    assert decision.status["live"]["batchId"] == 41 and decision.status["live"]["rate"] == 20.0
    world.shards[PARENT]["status"]["live"] = decision.status["live"]
    world.scrapes[PARENT] = Scraped(STATS, "2026-11-23T02:00:20Z", "127.42.0.2")
    assert "live" not in decide(world, PARENT).status, "the same numbers later: no write"
    world.scrapes[PARENT] = Scraped(STATS, "2026-11-23T02:00:30Z", "127.42.0.77")
    world.shards[PARENT]["status"].pop("live")
    assert "live" not in decide(world, PARENT).status, "a scrape of another pod IP (a replaced pod) is not mirrored"


def test_the_task_sums_its_active_shards_live_status():
    world = World()
    _running_shard(world)
    world.shards[PARENT]["status"]["live"] = STATS.to_status(observed_at="2026-11-23T02:00:10Z")
    decision = decide_task(world, NS, TASK)
    assert decision is not None
    live = decision.status["live"]
    assert (live["rate"], live["lag"], live["lagUnit"], live["shardsReporting"]) == (20.0, 512, "bytes", 1)


def test_conditions_are_equal_whatever_the_key_order_the_api_returns():
    """The API returns a condition's keys sorted; the operator builds them in another order. Comparing them as
    strings made every pass re-write unchanged conditions (two status writes per live update at scale)."""
    from taskshard_operator import status as st

    ours = [
        st.condition("Ready", True, "Emitting", "driver pod x processes [0, 4)", generation=1),
        st.condition("Degraded", False, "Healthy", "", generation=1),
        st.condition("Progressing", False, "Stable", "", generation=1),
        st.condition("Splitting", False, "NotSplitting", "", generation=1),
    ]
    from_api = [dict(sorted(c.items())) for c in reversed(ours)]
    assert [list(c) for c in from_api] != [list(c) for c in ours], "different key orders"
    assert st.conditions_equal(ours, from_api)
    changed = [*from_api[:-1], {**from_api[-1], "reason": "NotEmittingYet"}]
    assert not st.conditions_equal(ours, changed)


class _Server:
    """A metrics endpoint on loopback that answers as ``handler(wfile)`` writes, in its own thread."""

    def __init__(self, write) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                try:
                    write(self)
                except OSError:
                    pass  # the scraper hung up: what a bounded client does

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _drip(handler) -> None:
    """Headers, then one byte of body every 50 ms, forever (a read timeout per recv never fires)."""
    import time as _time

    handler.send_response(200)
    handler.end_headers()
    while True:
        handler.wfile.write(b"#")
        handler.wfile.flush()
        _time.sleep(0.05)


def _huge(handler) -> None:
    handler.send_response(200)
    handler.end_headers()
    chunk = b"# padding\n" * 100_000
    for _ in range(100):  # about 100 MB, unless the client stops reading
        handler.wfile.write(chunk)


def _good(handler) -> None:
    body = SCRAPE.encode()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_dripping_or_huge_endpoint_is_cut_off_and_delays_no_other_target():
    """The whole exchange has one deadline (not per socket read) and the answer a size cap; a round stores a fast
    target's answer while a slow one still drips."""
    import time as _time

    import pytest

    from taskshard_operator.live import ScrapeRefused, _fetch

    servers = {name: _Server(w) for name, w in (("drip", _drip), ("huge", _huge), ("good", _good))}
    try:
        target = {n: ScrapeTarget(NS, n, "127.0.0.1", s.port) for n, s in servers.items()}
        t0 = _time.monotonic()
        with pytest.raises(ScrapeRefused, match="no complete answer .* within 0.5 s"):
            _fetch(target["drip"], 0.5)
        assert _time.monotonic() - t0 < 5, "the deadline covers the whole answer"
        with pytest.raises(ScrapeRefused, match="larger than 1,000,000 bytes"):
            _fetch(target["huge"], 30, max_bytes=1_000_000)
        assert parse_scrape(_fetch(target["good"], 2)) == STATS

        store, enqueued = LiveStore(), []
        scraper = LiveScraper(
            store, lambda: [target["drip"], target["good"]], lambda ns, s: None, enqueued.append, timeout=0.5
        )
        try:
            assert scraper.scrape_all() == 1
        finally:
            scraper.stop()
        assert store.get(NS, "good").stats == STATS and store.get(NS, "drip") is None
        assert enqueued == [("shard", NS, "good")]
    finally:
        for s in servers.values():
            s.close()


def test_an_answer_older_than_three_intervals_is_stale():
    """The store keeps a pod's last answer while it stops answering; the answer says so once it is older than the
    store's bound (the autoscaler then holds instead of deciding on it)."""
    store = LiveStore()
    store.stale_seconds = 30.0
    store.put(NS, PARENT, Scraped(STATS, "2026-11-26T00:00:00Z", "10.0.0.1"), now=100.0)
    assert store.get(NS, PARENT, now=129.0).stale is False
    assert store.get(NS, PARENT, now=131.0).stale is True
    store.put(NS, PARENT, Scraped(STATS, "2026-11-26T00:00:31Z", "10.0.0.1"), now=131.0)
    assert store.get(NS, PARENT, now=132.0).stale is False, "a new answer is fresh again"


def test_a_tasks_watermark_is_its_slowest_shards_and_late_records_add_up():
    now = dt.datetime(2026, 11, 23, 2, 0, 30, tzinfo=dt.UTC)
    lives = [
        {"rate": 1.0, "watermark": "2026-11-23T01:59:10Z", "lateRecords": 3},
        {"rate": 1.0, "watermark": "2026-11-23T01:58:55Z", "lateRecords": 2},
        {"rate": 1.0},  # a shard without event time reports neither
    ]
    patch, _ = task_live_patch(None, lives, now=now)
    assert patch["watermark"] == "2026-11-23T01:58:55Z" and patch["lateRecords"] == 5
    assert "watermark" not in task_live_patch(None, lives[2:], now=now)[0]
