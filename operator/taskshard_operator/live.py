"""Live status: RATE, LAG and LAST BATCH of every running shard, without a status write per batch.

A shard's runtime exports its metrics on ``http://<pod IP>:<port>/metrics`` (names and parsing:
``spark_runtime.live``, the contract both sides import). The operator observes them like it observes
everything else, from memory:

- :class:`LiveScraper` (one thread) scrapes every running shard driver pod the cache knows, every
  ``interval`` seconds (10 by default, ``--live-status-seconds``), a few pods at a time, each exchange within
  one total deadline and size cap (:func:`_fetch`: a server that drips bytes or answers without end is cut off,
  since a Task author controls the shard image), and keeps the last answer per shard in :class:`LiveStore`. A
  round stores each answer as it arrives: a slow target delays no other. A shard whose answer would change its
  ``status.live`` gets a pass (its work-queue key); nothing else is enqueued.
- The shard's pass (``reconcile_shard``) copies the stored answer into ``status.live`` as part of its one status
  write (:func:`shard_live_patch`). One scrape per shard per interval means at most one such write per shard
  per interval, whatever the batch rate (no write storm with 500 shards).
- The Task's pass sums its active shards' ``status.live`` into the Task's (:func:`task_live_patch`), at most
  once per interval too. Its watermark is the lowest over every range and never goes back; its dead letters and
  late records are totals over its life, retired and deleted shards included (:class:`LifeCounts`).

A pod that does not answer keeps its last ``status.live`` (with its ``observedAt``); scrape outcomes are counted
in the operator's metrics (``taskshard_operator_live_scrapes_total``).
"""

from __future__ import annotations

import datetime as dt
import http.client
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from spark_runtime.live import METRICS_PATH, METRICS_PORT, LiveStats, live_stats
from taskshard_operator.split_points import parse_bucket
from taskshard_operator.status import rfc3339

__all__ = [
    "LIVE_INTERVAL_SECONDS",
    "Counts",
    "LifeCounts",
    "LiveScraper",
    "LiveStore",
    "STALE_SCRAPES",
    "ScrapeTarget",
    "Scraped",
    "TaskFigures",
    "parse_scrape",
    "shard_live_patch",
    "task_live_patch",
    "unheld_shards",
]

log = logging.getLogger(__name__)

LIVE_INTERVAL_SECONDS = 10.0
SCRAPE_TIMEOUT_SECONDS = 2.0
"""The whole exchange with one metrics endpoint: connect, headers and body (not per socket read)."""
SCRAPE_CONCURRENCY = 8
MAX_SCRAPE_BYTES = 4 << 20
"""The largest metrics answer read (a shard's is a few KiB; its load map at most a few hundred KiB)."""


def utc_now() -> str:
    return rfc3339()


def parse_scrape(text: str) -> LiveStats | None:
    """The :class:`LiveStats` of a Prometheus text scrape (None: no shard metrics in it)."""
    samples = (
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    return live_stats(samples)


@dataclass(frozen=True)
class ScrapeTarget:
    namespace: str
    shard: str
    pod_ip: str
    port: int = METRICS_PORT


LOAD_WINDOW_SECONDS = 300.0
"""The window a load-aware split point is chosen from: the growth of a shard's load map over the last five
minutes of scrapes (or since its runtime started, when it has run for less)."""


@dataclass(frozen=True)
class Scraped:
    stats: LiveStats
    observed_at: str
    pod_ip: str
    load: Mapping[tuple[int, int], float] = field(default_factory=dict)
    """Input rows per key-group bucket ``(start, end)`` over :attr:`load_seconds` (empty: the load map is off)."""
    load_seconds: float = 0.0
    """The time ``load`` covers; 0 when it holds everything since the runtime started (one scrape so far)."""
    scraped_at: float = 0.0
    """When the store got this answer (``time.monotonic()``)."""
    stale: bool = False
    """The answer is older than the store's :attr:`LiveStore.stale_seconds` (the pod stopped answering): what it
    says is no signal any more (set by :meth:`LiveStore.get`)."""

    @property
    def state(self) -> dict[tuple[int, int], float] | None:
        """The state map: state rows per key-group bucket ``(start, end)`` at :attr:`state_batch` (None: the
        runtime has not counted one)."""
        if self.stats.state_map_batch is None:
            return None
        return {parse_bucket(k): v for k, v in self.stats.key_group_state_rows.items()}

    @property
    def state_batch(self) -> int | None:
        return self.stats.state_map_batch


@dataclass
class LoadHistory:
    """One shard's recent load-map scrapes, for the growth over a window (pure: times are given)."""

    window: float = LOAD_WINDOW_SECONDS
    samples: deque[tuple[float, str, Mapping[str, float]]] = field(default_factory=deque)

    def add(self, now: float, pod_ip: str, rows: Mapping[str, float]) -> tuple[dict[tuple[int, int], float], float]:
        """Record a scrape; return the rows per bucket over the window and the seconds they cover: the growth since
        the newest sample at or before the window's start, or, while the pod's first sample is younger than the
        window, everything its counters hold (they start at zero with its runtime: 0 seconds = since it started).
        A new pod's counters start over: its samples alone count."""
        if self.samples and self.samples[-1][1] != pod_ip:
            self.samples.clear()
        self.samples.append((now, pod_ip, dict(rows)))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()  # keep the newest sample at or before the window's start as the baseline
        base_time, _, base = self.samples[0]
        if base_time > now - self.window:
            return {parse_bucket(k): v for k, v in rows.items() if v > 0}, 0.0
        growth = {parse_bucket(k): v - base.get(k, 0.0) for k, v in rows.items()}
        return {k: v for k, v in growth.items() if v > 0}, now - base_time


STALE_SCRAPES = 3
"""A shard's last answer is stale once this many scrape intervals passed without a new one."""


class LiveStore:
    """The last scrape per shard (thread-safe). Entries of shards no longer scraped are dropped by :meth:`keep`."""

    def __init__(self, load_window: float = LOAD_WINDOW_SECONDS) -> None:
        self._lock = threading.Lock()
        self._data: dict[tuple[str, str], Scraped] = {}
        self._history: dict[tuple[str, str], LoadHistory] = {}
        self.load_window = load_window
        self.stale_seconds = STALE_SCRAPES * LIVE_INTERVAL_SECONDS
        """An answer older than this is :attr:`Scraped.stale` (the runtime sets it from its scrape interval)."""
        self.enabled = True
        """The scraper runs (the runtime turns it off with ``--live-status-seconds 0``)."""

    def put(self, namespace: str, shard: str, scraped: Scraped, *, now: float | None = None) -> None:
        """Keep ``scraped`` as the shard's last answer, with its load map's growth over the window."""
        key = (namespace, shard)
        now = time.monotonic() if now is None else now
        scraped = replace(scraped, scraped_at=now)
        with self._lock:
            if scraped.stats.key_group_rows:
                history = self._history.setdefault(key, LoadHistory(self.load_window))
                load, seconds = history.add(now, scraped.pod_ip, scraped.stats.key_group_rows)
                scraped = replace(scraped, load=load, load_seconds=seconds)
            else:
                self._history.pop(key, None)
            self._data[key] = scraped

    def get(self, namespace: str, shard: str, *, now: float | None = None) -> Scraped | None:
        """The shard's last answer, marked :attr:`Scraped.stale` when it is older than :attr:`stale_seconds`."""
        with self._lock:
            scraped = self._data.get((namespace, shard))
        if scraped is None:
            return None
        now = time.monotonic() if now is None else now
        return replace(scraped, stale=now - scraped.scraped_at > self.stale_seconds)

    def keep(self, keys: Iterable[tuple[str, str]]) -> None:
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._data if k not in wanted]:
                del self._data[key]
                self._history.pop(key, None)


def _comparable(live: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (live or {}).items() if k != "observedAt"}


def shard_live_patch(current: Mapping[str, Any] | None, scraped: Scraped | None) -> dict[str, Any] | None:
    """The ``status.live`` to write for a shard (pure), or None when the scrape says nothing new."""
    if scraped is None:
        return None
    live = scraped.stats.to_status(observed_at=scraped.observed_at)
    if _comparable(live) == _comparable(current):
        return None
    return live


def _age_seconds(stamp: str | None, now: dt.datetime) -> float:
    if not stamp:
        return float("inf")
    try:
        then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (now - then).total_seconds()


@dataclass(frozen=True)
class Counts:
    """The counters a ``status.live`` shows: dead letters and, with event time, late records (None: not counted).
    A shard's own figures only grow over its life (a restarted runtime may show less for a while)."""

    dead_letters: int = 0
    late_records: int | None = None

    @classmethod
    def of_live(cls, live: Mapping[str, Any] | None) -> Counts:
        live = live or {}
        late = live.get("lateRecords")
        return cls(int(live.get("deadLetters") or 0), int(late) if late is not None else None)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deadLetters": self.dead_letters}
        if self.late_records is not None:
            out["lateRecords"] = self.late_records
        return out

    def highest(self, other: Counts) -> Counts:
        """Each counter's larger value (a count beats None)."""
        return Counts(max(self.dead_letters, other.dead_letters), _combine(max, self.late_records, other.late_records))

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.dead_letters + other.dead_letters, _combine(int.__add__, self.late_records, other.late_records)
        )


def _combine(op: Callable[[int, int], int], a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else op(a, b)


@dataclass(frozen=True)
class LifeCounts:
    """The memory behind a Task's counters (``status.live.counters``; pure): the highest counts each TaskShard of
    the Task still there (active and retired) has shown (:attr:`shards`), and the sum of the counts of those no
    longer there (:attr:`deleted`: pruned by history retention, or deleted by hand). The Task shows the sum of both:
    a total over its life that never falls, whatever the hand-overs (a successor counts its own records from 0, its
    parents keep theirs) or the pruning.

    :meth:`observe` folds a deleted shard's counts in by the first pass that no longer sees it, in the same status
    write that drops it from :attr:`shards`; the result depends only on the status read and the shards seen, so a
    repeated pass, or one whose write was refused, adds nothing twice. A shard must not be deleted before the
    memory holds its last counts (:meth:`holds`): history retention waits for that."""

    shards: Mapping[str, Counts] = field(default_factory=dict)
    deleted: Counts = field(default_factory=Counts)

    @classmethod
    def from_status(cls, live: Mapping[str, Any] | None) -> LifeCounts:
        """The memory a Task's ``status.live`` holds (empty: none yet)."""
        shown = (live or {}).get("counters") or {}
        shards = {str(e["name"]): Counts.of_live(e) for e in shown.get("shards") or [] if e.get("name")}
        return cls(shards, Counts.of_live(shown.get("deleted")))

    def status(self) -> dict[str, Any]:
        """``status.live.counters`` (the shards in name order)."""
        shards = [{"name": name, **self.shards[name].status()} for name in sorted(self.shards)]
        return {"shards": shards, "deleted": self.deleted.status()}

    def observe(self, seen: Mapping[str, Counts]) -> LifeCounts:
        """The memory once the Task's shards show ``seen`` (name -> counts, every TaskShard of the Task the cache
        shows): each shard's highest counts, and the counts of the remembered shards no longer seen folded into
        :attr:`deleted`."""
        shards = {
            name: counts.highest(self.shards.get(name, Counts()))
            for name, counts in seen.items()
            if name in self.shards or counts != Counts()  # nothing counted yet: nothing to remember
        }
        deleted = self.deleted
        for name, counts in self.shards.items():
            if name not in seen:
                deleted = deleted + counts
        return LifeCounts(shards, deleted)

    @property
    def total(self) -> Counts:
        total = self.deleted
        for counts in self.shards.values():
            total = total + counts
        return total

    def holds(self, name: str, counts: Counts) -> bool:
        """The memory holds ``counts`` of shard ``name`` (or more): deleting the shard now loses none of them."""
        remembered = self.shards.get(name, Counts())
        return remembered.highest(counts) == remembered


@dataclass(frozen=True)
class TaskFigures:
    """The figures of a Task's ``status.live`` the operator exports as metrics (``taskshard_operator_task_*``):
    its watermark (Unix seconds; None: none shown) and its counts over its life."""

    watermark: float | None
    counts: Counts

    @classmethod
    def of_live(cls, live: Mapping[str, Any] | None) -> TaskFigures | None:
        """None: the Task shows no ``status.live`` yet."""
        if not live:
            return None
        try:
            mark = dt.datetime.fromisoformat(str(live["watermark"]).replace("Z", "+00:00")).timestamp()
        except (KeyError, ValueError):
            mark = None
        return cls(mark, Counts.of_live(live))


def unheld_shards(current: Mapping[str, Any] | None, lives: Mapping[str, Mapping[str, Any] | None]) -> set[str]:
    """The shards (of ``lives``: name -> ``status.live``) whose counts the Task's ``status.live`` as written
    (``current``) does not hold yet: a shard deleted now would take them along (history retention waits)."""
    memory = LifeCounts.from_status(current)
    return {name for name, live in lives.items() if not memory.holds(name, Counts.of_live(live))}


def _watermark(previous: str | None, active: list[Mapping[str, Any] | None], every_range: bool) -> str | None:
    """The Task's watermark: the lowest of its active shards' once every range reports one, never lower than the
    previous value; while a range has not reported (a successor not scraped yet), the previous value. RFC 3339 in
    UTC, one format: the text order is the time order."""
    marks = [str(live["watermark"]) if live and live.get("watermark") else None for live in active]
    if not every_range or not marks or None in marks:
        return previous
    lowest = min(m for m in marks if m is not None)  # none is None here
    return lowest if previous is None or lowest > previous else previous


def task_live_patch(
    current: Mapping[str, Any] | None,
    lives: Mapping[str, Mapping[str, Any] | None],
    active: Iterable[str],
    *,
    now: dt.datetime,
    interval: float = LIVE_INTERVAL_SECONDS,
    every_range: bool = True,
) -> tuple[dict[str, Any] | None, float | None]:
    """The Task's ``status.live`` and, when it changed too soon after the last write, the seconds to wait instead:
    ``(patch, None)``, ``(None, wait)`` or ``(None, None)`` (nothing new).

    ``lives``: the ``status.live`` of every TaskShard of the Task (active and retired) by name; ``active``: the
    names of those that own a range; ``every_range``: the active shards tile the Task's key groups (False while
    initial shards are still to be created or the tiling is broken). Rate, lag and lagSeconds are the active
    shards' (sums; the largest lagSeconds). The watermark is the lowest over every range and never goes back
    (:func:`_watermark`). ``deadLetters`` and ``lateRecords`` are totals over the Task's life, retired and deleted
    shards included, and never fall (:class:`LifeCounts`, kept in ``counters``)."""
    active_lives = [lives.get(name) for name in active]
    reporting = [live for live in active_lives if live]
    memory = LifeCounts.from_status(current).observe({n: Counts.of_live(live) for n, live in lives.items()})
    if not reporting and memory == LifeCounts():
        return None, None
    units = {live.get("lagUnit") for live in reporting if live.get("lag") is not None}
    total = memory.total
    summed: dict[str, Any] = {
        "rate": round(sum(float(live.get("rate") or 0.0) for live in reporting), 1),
        "shardsReporting": len(reporting),
        "deadLetters": total.dead_letters,
    }
    behind = [int(live["lagSeconds"]) for live in reporting if live.get("lagSeconds") is not None]
    if behind:
        summed["lagSeconds"] = max(behind)
    if len(units) == 1:
        summed["lag"] = sum(int(live.get("lag") or 0) for live in reporting if live.get("lag") is not None)
        summed["lagUnit"] = units.pop()
    watermark = _watermark((current or {}).get("watermark"), active_lives, every_range)
    if watermark is not None:
        summed["watermark"] = watermark
    if total.late_records is not None:
        summed["lateRecords"] = total.late_records
    summed["counters"] = memory.status()
    if _comparable(summed) == _comparable(current):
        return None, None
    age = _age_seconds((current or {}).get("observedAt"), now)
    if age < interval:
        return None, interval - age
    return {**summed, "observedAt": rfc3339(now)}, None


class ScrapeRefused(OSError):
    """A metrics endpoint answered too slowly (over the whole deadline), too much, or not with 200."""


def _fetch(target: ScrapeTarget, timeout: float, max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    """The metrics text of ``target``, bounded: the whole exchange (connect, headers, body) within ``timeout``
    seconds, however slowly a server drips bytes (a timer shuts the socket down at the deadline), and at most
    ``max_bytes`` of body. Pod IPs are reached directly, never through a proxy. Raises :class:`ScrapeRefused`
    (or the connection's ``OSError``)."""
    conn = http.client.HTTPConnection(target.pod_ip, target.port, timeout=timeout)
    expired = threading.Event()
    sockets: list[socket.socket] = []  # the response keeps reading it after getresponse() drops conn.sock

    def cut() -> None:
        expired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", METRICS_PATH)
        if conn.sock is not None:
            sockets.append(conn.sock)
        if expired.is_set():  # the deadline passed while connecting
            cut()
        response = conn.getresponse()
        if response.status != 200:
            raise ScrapeRefused(f"HTTP {response.status} from {target.pod_ip}:{target.port}")
        body = bytearray()
        while chunk := response.read1(65536):
            body += chunk
            if len(body) > max_bytes:
                raise ScrapeRefused(f"the answer of {target.pod_ip}:{target.port} is larger than {max_bytes:,} bytes")
        if expired.is_set():
            raise ScrapeRefused(f"no complete answer from {target.pod_ip}:{target.port} within {timeout:g} s")
        return body.decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise ScrapeRefused(f"no complete answer from {target.pod_ip}:{target.port} within {timeout:g} s") from exc
        raise
    finally:
        timer.cancel()
        conn.close()


class LiveScraper:
    """Scrapes the targets every ``interval`` seconds in a daemon thread (see the module docstring).

    ``targets()`` lists what to scrape (from the cache); ``current(namespace, shard)`` the shard's
    ``status.live`` as observed; ``enqueue(key)`` asks for a shard pass; ``observe(outcome)`` counts a scrape.
    """

    def __init__(
        self,
        store: LiveStore,
        targets: Callable[[], list[ScrapeTarget]],
        current: Callable[[str, str], Mapping[str, Any] | None],
        enqueue: Callable[[Hashable], None],
        *,
        interval: float = LIVE_INTERVAL_SECONDS,
        timeout: float = SCRAPE_TIMEOUT_SECONDS,
        observe: Callable[[str], None] = lambda outcome: None,
        fetch: Callable[[ScrapeTarget, float], str] = _fetch,
    ) -> None:
        self.store, self.targets, self.current, self.enqueue = store, targets, current, enqueue
        self.interval, self.timeout, self.observe, self.fetch = interval, timeout, observe, fetch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=SCRAPE_CONCURRENCY, thread_name_prefix="live-scrape")

    def start(self) -> None:
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="live-scraper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.scrape_all()
            except Exception:  # never let the scraper die: the next round tries again
                log.exception("live status scrape round failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def scrape_all(self) -> int:
        """One round: scrape every target, store each answer as it arrives (a slow target delays no other's),
        enqueue the shards whose status would change. The round ends when every target answered or failed, or
        after ``interval`` seconds (at least ``timeout``): a target still in flight then is skipped this round
        (its own deadline, ``timeout``, ends it soon). Returns how many shards were enqueued."""
        targets = self.targets()
        self.store.keep((t.namespace, t.shard) for t in targets)
        enqueued = 0
        futures = {self._pool.submit(self._scrape_one, t): t for t in targets}
        try:
            for done in as_completed(futures, timeout=max(self.interval, self.timeout)):
                target, scraped = futures[done], done.result()
                if scraped is None:
                    continue
                self.store.put(target.namespace, target.shard, scraped)
                if shard_live_patch(self.current(target.namespace, target.shard), scraped) is not None:
                    self.enqueue(("shard", target.namespace, target.shard))
                    enqueued += 1
        except TimeoutError:
            late = sorted(f"{t.namespace}/{t.shard}" for f, t in futures.items() if not f.done())
            log.warning("live status round: %d targets did not answer in time: %s", len(late), ", ".join(late[:10]))
        return enqueued

    def _scrape_one(self, target: ScrapeTarget) -> Scraped | None:
        try:
            stats = parse_scrape(self.fetch(target, self.timeout))
        except Exception as exc:  # a pod still starting, a port not yet bound: not an error worth more
            self.observe("error")
            log.debug("scraping %s/%s at %s failed: %s", target.namespace, target.shard, target.pod_ip, exc)
            return None
        if stats is None:
            self.observe("empty")
            return None
        self.observe("ok")
        return Scraped(stats, utc_now(), target.pod_ip)
