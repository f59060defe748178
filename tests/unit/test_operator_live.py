"""Live status (taskshard_operator.live): parsing a shard's scrape, the scraper's rounds, and how the passes mirror
it into status.live at most once per scrape (shards) and once per interval (Tasks)."""

from __future__ import annotations

import datetime as dt
import functools

import pytest

from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.live import LiveStats
from taskshard_operator import naming
from taskshard_operator import reconcile_task as task_pass
from taskshard_operator.live import (
    LiveScraper,
    LiveStore,
    Scraped,
    ScrapeTarget,
    parse_scrape,
    shard_live_patch,
    task_live_patch,
    unheld_shards,
)
from taskshard_operator.reconcile_task import decide_task

from .fake_cluster import FakeKube, converge, new_world, phases, request_split
from .fake_observed import NS, PARENT, TASK, World, add_shard, decide, make_pod, running, sync_config
from .operator_spec import SPEC

pytestmark = pytest.mark.unit

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
    lives = {
        "a": {"rate": 10.0, "lag": 100, "lagUnit": "bytes", "deadLetters": 1},
        "b": {"rate": 5.5, "lag": 20, "lagUnit": "bytes", "deadLetters": 0},
        "c": None,  # a shard not reporting yet
    }
    active = ("a", "b", "c")
    patch, wait = task_live_patch(None, lives, active, now=now)
    assert wait is None and patch == {
        "rate": 15.5, "lag": 120, "lagUnit": "bytes", "deadLetters": 1, "shardsReporting": 2,
        "counters": {"shards": [{"name": "a", "deadLetters": 1}], "deleted": {"deadLetters": 0}},
        "observedAt": "2026-11-23T02:00:30Z",
    }  # fmt: skip
    assert task_live_patch(patch, lives, active, now=now + dt.timedelta(seconds=3)) == (None, None), "unchanged"
    lives["b"] = {**lives["b"], "rate": 7.5}
    changed_soon = task_live_patch(patch, lives, active, now=now + dt.timedelta(seconds=4))
    assert changed_soon[0] is None and 5.9 < changed_soon[1] <= 6.0, "a change within 10 s waits for the rest"
    later, _ = task_live_patch(patch, lives, active, now=now + dt.timedelta(seconds=10))
    assert later is not None and later["rate"] == 17.5
    mixed = {"a": {"rate": 1.0, "lag": 5, "lagUnit": "records"}, "b": {"rate": 1.0, "lag": 7, "lagUnit": "bytes"}}
    summed, _ = task_live_patch(None, mixed, ("a", "b"), now=now)
    assert "lag" not in summed, "records and bytes do not add up"
    assert task_live_patch(None, {"a": None}, ("a",), now=now) == (None, None)


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


def _wm(second: int) -> str:
    return f"2026-11-23T01:59:{second:02d}Z"


def test_a_tasks_watermark_is_its_slowest_ranges_and_never_goes_back():
    now = dt.datetime(2026, 11, 23, 2, 0, 30, tzinfo=dt.UTC)

    def watermark(current, lives, active, every_range=True):
        patch, _ = task_live_patch(current, lives, active, now=now, interval=0.0, every_range=every_range)
        return (patch or current or {}).get("watermark")

    lives = {"a": {"rate": 1.0, "watermark": _wm(10)}, "b": {"rate": 1.0, "watermark": _wm(30)}}
    first, _ = task_live_patch(None, lives, ("a", "b"), now=now)
    assert first["watermark"] == _wm(10), "the slowest range"
    assert watermark(None, {"a": lives["a"], "b": {"rate": 1.0}}, ("a", "b")) is None, "b has none yet: none"
    lives |= {"c": None, "d": None}  # a split a into c and d, which have not reported yet
    assert watermark(first, lives, ("c", "d", "b")) == _wm(10), "unreported ranges keep the Task where it was"
    lives["c"] = {"rate": 1.0, "watermark": _wm(12)}
    assert watermark(first, lives, ("c", "d", "b")) == _wm(10), "d has not reported yet"
    lives["d"] = {"rate": 1.0, "watermark": _wm(11)}
    assert watermark(first, lives, ("c", "d", "b")) == _wm(11)
    assert watermark({**first, "watermark": _wm(20)}, lives, ("c", "d", "b")) == _wm(20), "never back"
    assert watermark(first, lives, ("c", "d", "b"), every_range=False) == _wm(10), "a range without a shard"
    assert watermark(None, {"x": {"rate": 1.0}}, ("x",)) is None, "no event time: no watermark"


def test_a_tasks_counts_are_totals_over_its_life():
    now = dt.datetime(2026, 11, 23, 2, 0, 30, tzinfo=dt.UTC)

    def step(current, lives, active):
        patch, wait = task_live_patch(current, lives, active, now=now, interval=0.0)
        assert wait is None
        return patch or current

    lives = {"a": {"rate": 1.0, "lateRecords": 3, "deadLetters": 3}, "b": {"rate": 1.0, "lateRecords": 2}}
    shown = step(None, lives, ("a", "b"))
    assert (shown["lateRecords"], shown["deadLetters"]) == (5, 3)
    lives |= {"c": {"rate": 1.0, "lateRecords": 0}, "d": None}  # a split: the children count from 0
    shown = step(shown, lives, ("c", "d", "b"))
    assert (shown["lateRecords"], shown["deadLetters"]) == (5, 3), "the retired parent's counts stay"
    assert unheld_shards(shown, lives) == set()
    lives["a"] = {**lives["a"], "lateRecords": 4}  # its final scrape, not yet in the Task's status
    assert unheld_shards(shown, lives) == {"a"}, "deleted now, it would take a late record along"
    shown = step(shown, lives, ("c", "d", "b"))
    assert unheld_shards(shown, lives) == set() and shown["lateRecords"] == 6
    del lives["a"]  # history retention deleted it
    shown = step(shown, lives, ("c", "d", "b"))
    assert (shown["lateRecords"], shown["deadLetters"]) == (6, 3), "a deleted shard's counts stay"
    assert shown["counters"]["deleted"] == {"deadLetters": 3, "lateRecords": 4}
    assert [e["name"] for e in shown["counters"]["shards"]] == ["b", "c"]
    assert task_live_patch(shown, lives, ("c", "d", "b"), now=now, interval=0.0) == (None, None), "folded once"
    lives["b"] = {**lives["b"], "lateRecords": 0}  # a restarted runtime that has not recounted yet
    shown = step(shown, lives, ("c", "d", "b"))
    assert shown["lateRecords"] == 6, "a shard's count that dips does not make the Task's fall"
    lives["c"] = {**lives["c"], "lateRecords": 1}
    assert step(shown, lives, ("c", "d", "b"))["lateRecords"] == 7


# ---------------------------------------------------------------- the Task's figures across hand-overs

T0 = 1_800_000_000.0  # event time (Unix seconds) around which the shards' watermarks move


class Reports:
    """What the test's shard runtimes report: each shard's watermark and counters, set as its pod's last scrape
    (the shard pass mirrors it into status.live); a shard never given one has not reported yet. Every late record
    and dead letter a shard ever reported is kept here, so the test knows the Task's life totals."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.counts: dict[str, tuple[int, int]] = {}

    def report(self, shard: str, *, watermark: float, late: int, dead: int) -> None:
        pod = self.kube.objects[("pods", naming.pod_name(shard))]
        ip = pod.setdefault("status", {}).setdefault("podIP", f"10.0.0.{len(self.counts) + 1}")
        stats = LiveStats(3, None, 1.0, None, None, None, dead, True, watermark=watermark, late_records=late)
        self.kube.scrapes[shard] = Scraped(stats, "2026-11-26T00:00:00Z", ip)
        self.counts[shard] = (late, dead)

    def totals(self) -> tuple[int, int]:
        return sum(late for late, _ in self.counts.values()), sum(dead for _, dead in self.counts.values())


def _task_live(kube: FakeKube) -> dict:
    return (kube.objects[("tasks", "t")].get("status") or {}).get("live") or {}


def _rounds(kube: FakeKube, seen: list[dict], n: int) -> None:
    """``n`` rounds of passes and world steps, keeping the Task's status.live after each."""
    for _ in range(n):
        converge(kube, [], passes=1)
        seen.append(dict(_task_live(kube)))


def _assert_never_back(seen: list[dict]) -> None:
    marks = [live["watermark"] for live in seen if live.get("watermark")]
    assert marks == sorted(marks), f"the Task's watermark went back: {marks}"
    for key in ("lateRecords", "deadLetters"):
        counts = [live[key] for live in seen if key in live]
        assert counts == sorted(counts), f"the Task's {key} fell: {counts}"


def test_in_memory_the_tasks_watermark_never_goes_back_and_its_counts_are_life_totals(monkeypatch):
    """A split and a merge on the in-memory world, whose successors report only some rounds after they took over,
    with history retention pruning each retired shard as soon as its successors committed: at every observed moment
    the Task's watermark is the lowest over every range (a range not reported yet keeps the Task where it was), and
    its late records and dead letters count everything its shards ever counted, pruned ones included."""
    monkeypatch.setattr(task_pass, "task_live_patch", functools.partial(task_live_patch, interval=0.0))
    kube = new_world({**SPEC, "initialShards": 2, "history": {"retiredShards": 0}})
    converge(kube, [])
    assert phases(kube) == {"t-0-8": "Running", "t-8-16": "Running"}
    shards, seen = Reports(kube), []
    shards.report("t-0-8", watermark=T0 + 5, late=2, dead=2)
    shards.report("t-8-16", watermark=T0 + 20, late=1, dead=1)
    _rounds(kube, seen, 3)
    assert (seen[-1]["watermark"], seen[-1]["lateRecords"]) == ("2027-01-15T08:00:05Z", 3)
    shards.report("t-0-8", watermark=T0 + 7, late=4, dead=5)  # its last figures before the hand-over
    _rounds(kube, seen, 2)

    request_split(kube, "t-0-8")
    _rounds(kube, seen, 12)  # the children took over and have not reported yet
    assert phases(kube)["t-0-4"] == phases(kube)["t-4-8"] == "Running" and phases(kube)["t-0-8"] == "Split"
    assert seen[-1]["watermark"] == "2027-01-15T08:00:07Z", "an unreported range keeps the Task where it was"
    assert (seen[-1]["lateRecords"], seen[-1]["deadLetters"]) == (5, 6), "the split parent's counts stay"
    shards.report("t-0-4", watermark=T0 + 7, late=0, dead=0)  # the floor: the parent's final watermark
    _rounds(kube, seen, 3)
    assert seen[-1]["watermark"] == "2027-01-15T08:00:07Z", "t-4-8 has not reported yet"
    shards.report("t-4-8", watermark=T0 + 7, late=1, dead=1)
    shards.report("t-8-16", watermark=T0 + 30, late=3, dead=3)
    _rounds(kube, seen, 12)  # both children committed: retention prunes the parent
    assert "t-0-8" not in kube.shards(), "history retention deleted the split parent"
    shards.report("t-0-4", watermark=T0 + 9, late=2, dead=2)
    shards.report("t-4-8", watermark=T0 + 12, late=1, dead=1)
    _rounds(kube, seen, 3)
    assert seen[-1]["watermark"] == "2027-01-15T08:00:09Z"

    kube.patch_custom("taskshards", NS, "t-0-4", {"spec": {"merge": {"with": "t-4-8"}}})
    merged = naming.shard_name("t", KeyGroupRange(0, 8), naming.merge_family("t-0-4", "t-4-8"))
    _rounds(kube, seen, 15)  # the merged shard took over and has not reported yet
    assert phases(kube)[merged] == "Running", phases(kube)
    assert seen[-1]["watermark"] == "2027-01-15T08:00:09Z"
    shards.report(merged, watermark=T0 + 12, late=1, dead=1)  # the larger of its parents' final watermarks
    _rounds(kube, seen, 15)
    assert not {"t-0-4", "t-4-8"} & set(kube.shards()), "history retention deleted the merged-away shards"

    _assert_never_back(seen)
    late, dead = shards.totals()
    assert (seen[-1]["lateRecords"], seen[-1]["deadLetters"]) == (late, dead) == (11, 12)
    assert seen[-1]["watermark"] == "2027-01-15T08:00:12Z"
    _rounds(kube, seen, 3)
    assert (seen[-1]["lateRecords"], seen[-1]["deadLetters"]) == (late, dead), "repeated passes add nothing twice"


def test_history_retention_waits_until_the_tasks_status_holds_a_retired_shards_counts():
    """A split parent whose last counts came after the Task's last live-status write (which waits for the interval)
    is not pruned until the Task's status.live.counters holds them: deleted sooner, they would be lost."""
    from taskshard_operator.act import Create
    from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard

    kube = new_world({**SPEC, "history": {"retiredShards": 0}})
    converge(kube, [])
    shards = Reports(kube)
    shards.report(PARENT, watermark=T0, late=2, dead=2)
    converge(kube, [], passes=2)
    request_split(kube, PARENT)
    converge(kube, [], passes=12)
    assert phases(kube) == {PARENT: "Split", "t-0-8": "Running", "t-8-16": "Running"}
    parent_live = kube.objects[("taskshards", PARENT)]["status"]["live"]
    parent_live["lateRecords"] = 3  # its final scrape, mirrored after the Task's last write
    task_live = kube.objects[("tasks", "t")]["status"]["live"]
    task_live["observedAt"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # written just now
    for child in ("t-0-8", "t-8-16"):  # the children commit: nothing needs the parent any more
        shards.report(child, watermark=T0, late=0, dead=0)
        reconcile_shard(kube, kube, NS, child, emit=lambda *a: None, backoff=PodReplacementBackoff(base=0.0))

    def prune_pods(decision) -> list:
        return [a for a in decision.actions if isinstance(a, Create) and a.plural == "pods"]

    waiting = decide_task(kube, NS, TASK)
    assert not prune_pods(waiting) and "live" not in waiting.status, "the Task's next write waits for the interval"
    assert waiting.requeue_after is not None
    task_live["observedAt"] = "2020-01-01T00:00:00Z"
    writing = decide_task(kube, NS, TASK)
    assert writing.status["live"]["lateRecords"] == 3 and not prune_pods(writing), "the counts first, then a prune"
    kube.patch_custom_status("tasks", NS, TASK, writing.status)
    assert prune_pods(decide_task(kube, NS, TASK)), "once the status holds them, the parent is pruned"
