"""The coalescing work queue (:class:`taskshard_operator.workqueue.WorkQueue`): one pass per key at a time, adds
coalesced, delays honoured, a pass's requested re-run, retries with back-off, the observer, ``pending()`` and
``stop()``.

Passes are held with :class:`threading.Event` where a test needs a pass to be running; everything else is awaited
with a polling helper that has a deadline (never a bare sleep as synchronisation).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

import pytest

from taskshard_operator.workqueue import WorkQueue

pytestmark = pytest.mark.unit

TIMEOUT = 3.0
"""Upper bound for anything a test waits for (a failing test fails within this, a passing one much sooner)."""


def wait_until(probe: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.002)


@pytest.fixture
def make_queue():
    """A WorkQueue factory; every queue made is stopped at teardown."""
    queues: list[WorkQueue] = []

    def make(run: Callable[[Hashable], float | None], **kwargs) -> WorkQueue:
        q = WorkQueue(run, **kwargs)
        queues.append(q)
        return q

    yield make
    for q in queues:
        q.stop(timeout=TIMEOUT)


class Recorder:
    """A pass that records (key, start, end) and returns what ``result(key, n)`` says (n = the key's run count)."""

    def __init__(self, result: Callable[[Hashable, int], float | None] = lambda key, n: None) -> None:
        self.result = result
        self.lock = threading.Lock()
        self.runs: list[tuple[Hashable, float, float]] = []
        self.counts: dict[Hashable, int] = {}

    def __call__(self, key: Hashable) -> float | None:
        start = time.monotonic()
        with self.lock:
            n = self.counts[key] = self.counts.get(key, 0) + 1
        try:
            return self.result(key, n)
        finally:
            with self.lock:
                self.runs.append((key, start, time.monotonic()))

    def of(self, key: Hashable) -> list[tuple[float, float]]:
        with self.lock:
            return [(s, e) for k, s, e in self.runs if k == key]


# ---------------------------------------------------------------- coalescing


def test_a_key_added_many_times_while_queued_runs_once(make_queue):
    rec = Recorder()
    q = make_queue(rec, workers=2)
    for _ in range(100):
        q.add("a")
    q.add("b")
    assert q.pending() == 2, "a key is queued at most once"
    q.start()
    wait_until(lambda: q.pending() == 0, "the queue to drain")
    assert rec.counts == {"a": 1, "b": 1}


def test_a_key_added_while_its_pass_runs_runs_exactly_once_more_after_it(make_queue):
    started, release = threading.Event(), threading.Event()

    def result(key, n):
        if n == 1:
            started.set()
            assert release.wait(TIMEOUT), "the test never released the first pass"
        return None

    rec = Recorder(result)
    q = make_queue(rec, workers=2)  # an idle second worker must not pick the key up meanwhile
    q.add("a")
    q.start()
    assert started.wait(TIMEOUT)
    for _ in range(10):
        q.add("a")
    assert rec.counts == {"a": 1}, "no second pass while the first runs"
    assert q.pending() == 1
    release.set()
    wait_until(lambda: q.pending() == 0, "the queue to drain")
    runs = rec.of("a")
    assert len(runs) == 2, "dirty: exactly one more pass"
    (_, first_end), (second_start, _) = runs
    assert second_start >= first_end, "the second pass started before the first ended"


def test_two_keys_run_concurrently_but_a_key_never_overlaps_itself(make_queue):
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    met: list[Hashable] = []

    def result(key, n):
        if n == 1:
            barrier.wait()  # raises BrokenBarrierError unless both keys' first passes run at once
            met.append(key)
        return None

    q = make_queue(Recorder(result), workers=2)
    q.add("a")
    q.add("b")
    q.start()
    wait_until(lambda: q.pending() == 0, "both passes")
    assert sorted(met) == ["a", "b"], "the two keys' passes did not run concurrently"


def test_a_key_never_overlaps_itself_under_a_storm_of_adds(make_queue):
    lock = threading.Lock()
    active: dict[str, int] = {}
    most: dict[str, int] = {}
    total = {"now": 0, "most": 0}

    def run(key):
        with lock:
            active[key] = active.get(key, 0) + 1
            most[key] = max(most.get(key, 0), active[key])
            total["now"] += 1
            total["most"] = max(total["most"], total["now"])
        time.sleep(0.001)  # the pass's work, so that passes have a chance to overlap
        with lock:
            active[key] -= 1
            total["now"] -= 1

    q = make_queue(run, workers=4)
    q.start()

    def produce():
        for i in range(300):
            q.add(("a", "b")[i % 2])

    producers = [threading.Thread(target=produce) for _ in range(3)]
    for p in producers:
        p.start()
    for p in producers:
        p.join(TIMEOUT)
    wait_until(lambda: q.pending() == 0, "the storm to settle")
    assert most == {"a": 1, "b": 1}, f"a key ran concurrently with itself: {most}"
    assert total["most"] <= 2, "more passes at once than keys"


# ---------------------------------------------------------------- delays


def test_a_delayed_add_waits_and_a_later_one_neither_postpones_nor_duplicates_it(make_queue):
    ran = threading.Event()
    rec = Recorder(lambda key, n: ran.set())
    q = make_queue(rec, workers=2)
    q.start()
    t0 = time.monotonic()
    q.add("a", 0.2)
    q.add("a", 30.0)  # due later than the pending one: changes nothing
    assert q.pending() == 1
    assert ran.wait(TIMEOUT)
    (start, _), *_ = rec.of("a")
    assert start - t0 >= 0.2, "ran before its delay"
    assert start - t0 < 2.0, "postponed by the later add"
    wait_until(lambda: q.pending() == 0, "nothing left due")
    assert len(rec.of("a")) == 1


def test_an_earlier_delayed_add_brings_the_pass_forward_once(make_queue):
    ran = threading.Event()
    rec = Recorder(lambda key, n: ran.set())
    q = make_queue(rec, workers=1)
    q.start()
    t0 = time.monotonic()
    q.add("a", 30.0)
    q.add("a", 0.05)
    assert ran.wait(TIMEOUT)
    (start, _), *_ = rec.of("a")
    assert 0.05 <= start - t0 < 2.0
    wait_until(lambda: q.pending() == 0, "the 30 s entry to be dropped")
    assert len(rec.of("a")) == 1


def test_an_immediate_add_supersedes_a_delayed_one(make_queue):
    ran = threading.Event()
    rec = Recorder(lambda key, n: ran.set())
    q = make_queue(rec, workers=1)
    q.add("a", 30.0)
    assert q.pending() == 1, "a key waiting for its delay is pending"
    q.add("a")
    q.start()
    assert ran.wait(TIMEOUT)
    wait_until(lambda: q.pending() == 0, "nothing left due")
    assert len(rec.of("a")) == 1
    q.add("a", 10.0)
    assert q.pending() == 1 and len(rec.of("a")) == 1, "a delayed add does not run at once"


def test_a_pass_returning_seconds_runs_again_after_about_that_delay(make_queue):
    again = threading.Event()

    def result(key, n):
        if n == 2:
            again.set()
        return 0.15 if n == 1 else None

    rec = Recorder(result)
    q = make_queue(rec, workers=2)
    q.add("a")
    q.start()
    assert again.wait(TIMEOUT)
    wait_until(lambda: q.pending() == 0, "the queue to drain")
    (_, first_end), (second_start, _) = rec.of("a")
    assert 0.15 <= second_start - first_end < 2.0
    assert len(rec.of("a")) == 2, "None: no further pass"


# ---------------------------------------------------------------- failures


def test_a_failing_pass_is_retried_with_back_off_and_success_resets_it(make_queue, caplog):
    caplog.set_level(logging.WARNING, logger="taskshard_operator")
    fail_on = {1, 2, 4}
    done = {3: threading.Event(), 5: threading.Event()}

    def result(key, n):
        if n in done:
            done[n].set()
        if n in fail_on:
            raise RuntimeError(f"boom {n}")
        return None

    rec = Recorder(result)
    q = make_queue(rec, workers=1, retry_base=0.05, retry_cap=1.0, name="retry-test")
    q.add("a")
    q.start()
    assert done[3].wait(TIMEOUT), "the failed pass was not retried"
    wait_until(lambda: q.pending() == 0, "the success to settle")
    runs = rec.of("a")
    assert len(runs) == 3
    assert runs[1][0] - runs[0][1] >= 0.05, "first retry sooner than retry_base"
    assert runs[2][0] - runs[1][1] >= 0.10, "second retry sooner than retry_base * 2"

    q.add("a")  # fails once more (n = 4): the back-off starts again from retry_base
    assert done[5].wait(TIMEOUT)
    wait_until(lambda: q.pending() == 0, "the second success to settle")
    retries = [r.getMessage() for r in caplog.records if "retry-test" in r.getMessage()]
    assert [m.split("(retry ")[1].split(" ")[0] for m in retries] == ["1", "2", "1"], retries
    assert "in 0.1s" in retries[1] and "boom 2" in retries[1]
    assert len(rec.of("a")) == 5


def test_a_failure_while_dirty_is_retried_not_lost(make_queue):
    started, release, retried = threading.Event(), threading.Event(), threading.Event()

    def result(key, n):
        if n == 1:
            started.set()
            assert release.wait(TIMEOUT)
            raise RuntimeError("boom")
        retried.set()
        return None

    rec = Recorder(result)
    q = make_queue(rec, workers=2, retry_base=0.05)
    q.add("a")
    q.start()
    assert started.wait(TIMEOUT)
    q.add("a")  # dirty
    release.set()
    assert retried.wait(TIMEOUT)
    wait_until(lambda: q.pending() == 0, "the retry to settle")
    runs = rec.of("a")
    assert len(runs) == 2
    assert runs[1][0] - runs[0][1] >= 0.05, "a failed pass is retried after its back-off, even when dirty"


# ---------------------------------------------------------------- observer, pending, stop


def test_the_observer_sees_every_finished_pass(make_queue):
    lock = threading.Lock()
    seen: list[tuple[Hashable, float, BaseException | None]] = []
    both = threading.Event()

    def run(key):
        if key == "bad":
            raise ValueError("bad pass")
        time.sleep(0.02)  # the pass's work (the observer reports its duration)
        return None

    def observer(key, seconds, error):
        with lock:
            seen.append((key, seconds, error))
            if len(seen) == 2:
                both.set()

    q = make_queue(run, workers=2, retry_base=60.0)  # no retry of "bad" within the test
    q.observer = observer
    q.add("good")
    q.add("bad")
    q.start()
    assert both.wait(TIMEOUT)
    by_key = {k: (s, e) for k, s, e in seen}
    good_seconds, good_error = by_key["good"]
    assert good_error is None and good_seconds >= 0.02
    bad_seconds, bad_error = by_key["bad"]
    assert isinstance(bad_error, ValueError) and str(bad_error) == "bad pass" and bad_seconds >= 0.0
    assert q.pending() == 1, "the failed key waits for its retry"


def test_stop_joins_the_workers_and_start_resumes(make_queue):
    rec = Recorder()
    q = make_queue(rec, workers=3, name="wq-stop-test")

    def workers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("wq-stop-test-") and t.is_alive()]

    q.start()
    q.start()  # idempotent
    assert len(workers()) == 3
    q.add("a")
    wait_until(lambda: q.pending() == 0, "a pass")
    q.stop()
    assert workers() == [], "stop() returned with worker threads alive"

    q.add("b")
    assert q.pending() == 1 and "b" not in rec.counts, "no worker runs after stop()"
    q.start()
    wait_until(lambda: q.pending() == 0, "a pass after a restart")
    assert rec.counts == {"a": 1, "b": 1}
