"""Load-aware split point on skewed keys: a ``by: load`` split of one shard next to a midpoint split, same input.

A script, not a test. Steps (one SparkSession, local[2], every shard an in-process
:class:`spark_runtime.shard.ShardRunner` running its own ``run()`` loop in a thread, as in a pod, with its live
metrics endpoint on a free port of 127.0.0.1):

1. One Task, ``maxKeyGroups`` 128 (the demo's value), one shard ``[0, 128)`` with the load map on
   (``spark.taskshard.keyGroupMetrics: "true"``), the builtin count, a journal of ``--events`` events whose keys
   are Zipf-distributed (``P(rank k) ~ 1 / k^s``, ``--s`` 1.1 over ``--keys`` 20,000 distinct keys, seeded numpy).
2. Once the shard has consumed phase 1: its load map is read the way the operator reads it, a scrape of
   ``http://127.0.0.1:<metricsPort>/metrics`` parsed with ``prometheus_client``
   (``taskshard_shard_key_group_rows_total{key_groups="<a>-<b>"}``; 64 buckets of 2 key groups for 128 key
   groups), and handed to :func:`taskshard_operator.split_points.load_split_point` (the by-load point and its
   expected shares); the midpoint is ``KeyGroupRange.midpoint()``, its expected shares from the same map.
3. The parent drains (a final drain: ``drained.json``), then phase 2 (``--phase2-events`` new draws from the same
   distribution) is appended, and two real splits run, one after the other: children over ``[0, at)`` and
   ``[at, 128)`` restore from the parent's drain summary (``restoreFrom.manifest: <parent dir>/drained.json``)
   and process phase 2; the same for the midpoint, in a second storage and sink directory (a copy of the Task:
   same parent snapshot, same journal; the two pairs never run at once). Each child also has the load map on:
   its input rows are the sum of its own load map, scraped from its own endpoint once it has consumed the
   journal. (``taskshard_shard_rows_total`` is not the measure: a journal shard reads every event and drops the
   key groups it does not own, and a restored child's first batch also reads its seed rows.)
4. Cross-check: the rows of each shard counted in Python from the events (``key_group`` is Spark's
   ``pmod(hash(key), 128)`` bit for bit), per child and per bucket of every scraped load map (table 3: the sums
   agree by construction, the runtime scales the histogram to the batch's ``count(1)``; the buckets need not).

Target (issue "Load-aware split points"): the by-load children's input rows differ by at most 15 %,
``imbalance = (larger - smaller) / larger`` (:func:`taskshard_operator.split_points.imbalance`); the midpoint split
is reported next to it. Prints the tables and writes ``<out>/split_skew.{json,png}``.

    .venv/bin/python bench/split_skew.py --events 200000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    LoadSampler,
    command_line,
    cpu_times,
    machine,
    print_table,
    pyplot,
    say,
    write_result,
)

TASK = "skew"
MAX_KEY_GROUPS = 128
TARGET = 0.15
LOAD_MAP = "taskshard_shard_key_group_rows_total"
ROWS = "taskshard_shard_rows_total"
STEADY_SECONDS = 30.0
"""A load map that has not changed for this long after its shard caught up is final (even if it is off)."""
CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.taskshard.keyGroupMetrics": "true",
}


# ---------------------------------------------------------------- pure helpers (tests/unit/test_bench_split_skew.py)


def zipf_probabilities(keys: int, s: float) -> list[float]:
    """``P(rank k) = k^-s / sum_j j^-s`` for ranks ``1..keys`` (index 0 is the hottest key)."""
    weights = [1.0 / (k**s) for k in range(1, keys + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def key_name(rank: int) -> str:
    """The key of a rank (0: the hottest)."""
    return f"k{rank}"


def rows_per_key_group(counts: Iterable[tuple[str, int]], max_key_groups: int) -> list[int]:
    """Rows per key group (index = key group) of ``(key, rows)`` pairs, by Spark's ``pmod(hash(key), n)``."""
    from spark_runtime.keygroups import key_group

    out = [0] * max_key_groups
    for key, n in counts:
        out[key_group(key, max_key_groups)] += int(n)
    return out


def parse_scrape(text: str) -> tuple[dict[tuple[int, int], float], dict[str, float]]:
    """A Prometheus text scrape -> (the load map ``{(start, end): rows}``, the other unlabelled-enough values by
    sample name: ``taskshard_shard_rows_total``, ``taskshard_shard_last_batch``, ...)."""
    from prometheus_client.parser import text_string_to_metric_families

    from taskshard_operator.split_points import parse_bucket

    load: dict[tuple[int, int], float] = {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LOAD_MAP:
                bucket = parse_bucket(sample.labels["key_groups"])
                load[bucket] = load.get(bucket, 0.0) + sample.value
            elif not sample.name.endswith("_created"):
                values.setdefault(sample.name, sample.value)
    return load, values


def spread(buckets: Mapping[tuple[int, int], float], start: int, end: int) -> list[float]:
    """Rows per key group of ``[start, end)`` from a load map (a bucket's rows spread evenly over its key groups,
    as the chooser reads it)."""
    rows = [0.0] * (end - start)
    for (a, b), n in buckets.items():
        if b <= a:
            continue
        for kg in range(max(a, start), min(b, end)):
            rows[kg - start] += float(n) / (b - a)
    return rows


def split_rows(per_key_group: Sequence[float], at: int, start: int = 0) -> tuple[float, float]:
    """Rows of ``[start, at)`` and ``[at, start + len)``."""
    low = sum(per_key_group[: at - start])
    return low, sum(per_key_group) - low


def best_point(per_key_group: Sequence[float], start: int = 0) -> tuple[int, float]:
    """The split point with the smallest imbalance over ``per_key_group`` (in hindsight: what the best possible
    point would have given on these rows) and that imbalance."""
    from taskshard_operator.split_points import imbalance

    total = sum(per_key_group)
    best: tuple[float, int] | None = None
    left = 0.0
    for offset in range(1, len(per_key_group)):
        left += per_key_group[offset - 1]
        value = imbalance(left, total - left)
        if best is None or value < best[0]:
            best = (value, start + offset)
    assert best is not None, "needs at least two key groups"
    return best[1], best[0]


def map_errors(
    load: Mapping[tuple[int, int], float], truth: Sequence[int], start: int, end: int
) -> list[tuple[str, float, int]]:
    """The buckets of ``[start, end)`` (the runtime's layout, :func:`spark_runtime.live.key_group_buckets`) whose
    scraped rows differ from ``truth`` (rows per key group, index = key group): ``(label, scraped, counted)``."""
    from spark_runtime.live import key_group_buckets

    out = []
    for a, b in key_group_buckets(start, end):
        got, want = float(load.get((a, b), 0.0)), int(sum(truth[a:b]))
        if abs(got - want) > 0.5:
            out.append((f"{a}-{b}", got, want))
    return out


def straddles_target(per_key_group: Sequence[float], target: float = TARGET) -> list[int]:
    """The key groups that no split point can leave on either side without missing ``target``: those whose rows
    begin below the lowest acceptable share of the total and end above the highest (one alone decides the
    target, whatever its share; a hot key group away from the middle does not)."""
    total = sum(per_key_group)
    if total <= 0:
        return []
    lo, hi = (1 - target) / (2 - target), 1 / (2 - target)  # shares s with imbalance(s, 1 - s) <= target
    out, left = [], 0.0
    for kg, rows in enumerate(per_key_group):
        if left / total < lo and (left + rows) / total > hi:
            out.append(kg)
        left += rows
    return out


# ---------------------------------------------------------------- shards


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def journal_ends(journal: Path, partitions: int) -> dict[str, int]:
    ends = {}
    for p in range(partitions):
        path = journal / f"p{p}.jsonl"
        data = path.read_bytes() if path.exists() else b""
        ends[f"p{p}.jsonl"] = data.rfind(b"\n") + 1
    return ends


class Shard:
    """One shard runtime in this process: ``ShardRunner.run()`` in a thread (the pod's loop, with its metrics
    endpoint), the load map read back over HTTP."""

    def __init__(
        self, spark: Any, root: Path, layout: str, start: int, end: int, partitions: int, restore: dict | None
    ) -> None:
        from spark_runtime.config import parse_config
        from spark_runtime.shard import ShardRunner

        self.name = f"{TASK}-{start}-{end}"
        self.start_kg, self.end_kg = start, end
        self.port = free_port()
        cfg = parse_config(
            {
                "task": TASK,
                "shard": self.name,
                "maxKeyGroups": MAX_KEY_GROUPS,
                "keyGroups": {"start": start, "end": end},
                "processor": {"builtin": "count"},
                "source": {"journal": {"path": str(root / "journal"), "partitions": partitions}},
                "sink": {"directory": {"path": str(root / layout / "out"), "format": "jsonl"}},
                "storage": {"path": str(root / layout / "state")},
                "restoreFrom": restore,
                "spark": {"master": "local[2]", "conf": CONF, "triggerInterval": "500 milliseconds"},
                "terminationMessagePath": str(root / layout / f"termination-{self.name}.log"),
                "metricsPort": self.port,
            }
        )
        self.runner = ShardRunner(cfg, spark)
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.started = 0.0

    def _run(self) -> None:
        try:
            self.outcome["summary"] = self.runner.run(poll_interval=0.2)
        except BaseException as exc:  # reported by check()
            self.outcome["error"] = exc

    def start(self) -> Shard:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def check(self) -> None:
        if "error" in self.outcome:
            raise RuntimeError(f"shard {self.name} failed: {self.outcome['error']!r}") from self.outcome["error"]

    def scrape(self) -> tuple[dict[tuple[int, int], float], dict[str, float]]:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return parse_scrape(response.read().decode())

    def progress(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.runner.paths.progress.read_text())
        except (OSError, ValueError):
            return None

    def wait_load_map(self, ends: dict[str, int], expected_rows: int, timeout: float) -> dict[str, Any]:
        """Wait until the shard has committed a batch at the journal's ``ends`` and its load map stopped growing
        (it sums to ``expected_rows``, or it stayed the same for :data:`STEADY_SECONDS` after the shard caught up:
        a mismatch is reported, not hidden; a batch's metrics follow its commit by a poll or two); returns the last
        scrape and when the shard caught up."""
        deadline = time.monotonic() + timeout
        caught_up: float | None = None
        last: tuple[dict, dict] | None = None
        same_since = time.monotonic()
        while time.monotonic() < deadline:
            self.check()
            if caught_up is None and (self.progress() or {}).get("positions") == ends:
                caught_up = time.monotonic()
            try:
                scraped = self.scrape()
            except (urllib.error.URLError, ConnectionError, OSError):  # run() has not bound the port yet
                scraped = None
            if scraped is not None:
                if last is None or scraped[0] != last[0]:
                    same_since = time.monotonic()
                last = scraped
                total = sum(scraped[0].values())
                steady = time.monotonic() - max(same_since, caught_up or 0.0)
                if caught_up is not None and (total == expected_rows or steady > STEADY_SECONDS):
                    return {
                        "load": scraped[0],
                        "values": scraped[1],
                        "caughtUpSeconds": round(caught_up - self.started, 2),
                    }
            time.sleep(0.25)
        raise RuntimeError(
            f"shard {self.name} did not consume the journal up to {ends} within {timeout:.0f} s "
            f"(progress {self.progress()}, load map sum {sum(last[0].values()) if last else None})"
        )

    def drain(self, reason: str, timeout: float = 300) -> dict[str, Any]:
        self.runner.request_drain(reason, final=True)
        self.thread.join(timeout=timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"shard {self.name} did not drain within {timeout:.0f} s")
        self.check()
        return self.outcome["summary"]


# ---------------------------------------------------------------- the benchmark


def draw(n: int, probabilities: Any, rng: Any, first_seq: int) -> tuple[list[dict[str, Any]], Any]:
    """``n`` events with Zipf-ranked keys; returns them and the rows per rank."""
    import numpy as np

    ranks = rng.choice(len(probabilities), size=n, p=probabilities)
    events = [{"key": key_name(int(r)), "seq": first_seq + i} for i, r in enumerate(ranks)]
    return events, np.bincount(ranks, minlength=len(probabilities))


def run_split(
    spark: Any, root: Path, layout: str, at: int, partitions: int, manifest: str, expected: tuple[int, int]
) -> dict[str, Any]:
    """Children ``[0, at)`` and ``[at, 128)`` restored from the parent's drain summary, run until they have
    consumed the journal (phase 2); their load maps from their endpoints."""
    restore = {"parent": f"{TASK}-0-{MAX_KEY_GROUPS}", "manifest": manifest}
    t0 = time.monotonic()
    children = [
        Shard(spark, root, layout, a, b, partitions, restore).start() for a, b in ((0, at), (at, MAX_KEY_GROUPS))
    ]
    ends = journal_ends(root / "journal", partitions)
    out: dict[str, Any] = {"at": at, "children": []}
    try:
        for child, rows in zip(children, expected, strict=True):
            scraped = child.wait_load_map(ends, rows, timeout=900)
            out["children"].append(
                {
                    "shard": child.name,
                    "keyGroups": [child.start_kg, child.end_kg],
                    "rows": sum(scraped["load"].values()),
                    "rowsByHash": rows,
                    "sourceRowsRead": scraped["values"].get(ROWS),
                    "loadMap": {f"{a}-{b}": v for (a, b), v in sorted(scraped["load"].items())},
                    "startToCaughtUpSeconds": scraped["caughtUpSeconds"],
                }
            )
        out["startToBothCaughtUpSeconds"] = round(time.monotonic() - t0, 2)
    finally:
        for child in children:
            if child.thread.is_alive():
                child.drain("benchmark done")
    return out


def plot(
    phase1_map: list[float],
    phase2_rows: list[int],
    points: dict[str, int],
    path: Path,
    title: str,
) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.2))
    xs = list(range(len(phase2_rows)))
    ax.bar(xs, phase2_rows, width=0.85, color="#7aa6c2", label="phase 2 rows per key group (the children's input)")
    ax.step(
        [x - 0.5 for x in xs] + [len(xs) - 0.5],
        phase1_map + [phase1_map[-1]],
        where="post",
        color="#555555",
        lw=0.8,
        label="phase 1 load map, as scraped (2 key groups per bucket, spread)",
    )
    colors = {"by load": "#c0392b", "midpoint": "#27ae60"}
    for i, (mode, at) in enumerate(points.items()):
        ax.axvline(at - 0.5, color=colors.get(mode, "black"), lw=1.6, ls="-" if mode == "by load" else "--")
        ax.text(at + 0.5, 0.96 - 0.07 * i, f"{mode}: at {at}", transform=ax.get_xaxis_transform(), fontsize=8)
    twin = ax.twinx()
    total = sum(phase2_rows) or 1
    cumulative, acc = [], 0
    for r in phase2_rows:
        acc += r
        cumulative.append(acc / total)
    twin.plot([x + 0.5 for x in xs], cumulative, color="#8e44ad", lw=0.9, label="cumulative share (phase 2)")
    twin.axhline(0.5, color="#8e44ad", lw=0.5, ls=":")
    twin.set_ylim(0, 1)
    twin.set_ylabel("cumulative share of rows")
    ax.set_xlim(-1, len(xs))
    ax.set_xlabel("key group")
    ax.set_ylabel("rows")
    ax.set_title(title, fontsize=9)
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(
        lines[0] + more[0],
        lines[1] + more[1],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.13),
        ncol=3,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="phase 1 events (the load map; default 200,000)")
    ap.add_argument("--phase2-events", type=int, default=None, help="phase 2 events (default: --events)")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20,000)")
    ap.add_argument("--s", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    phase2 = args.phase2_events or args.events
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark_runtime.live import METRICS_HOST_ENV

    os.environ[METRICS_HOST_ENV] = "127.0.0.1"  # the endpoints bind this host's loopback only

    import numpy as np

    from spark_runtime.keygroups import KeyGroupRange
    from spark_runtime.produce import append_events
    from taskshard_operator.split_points import imbalance, load_split_point

    root = args.out / "work" / "split_skew"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    whole = KeyGroupRange(0, MAX_KEY_GROUPS)
    t_begin = time.monotonic()
    stat0 = cpu_times()
    timings: dict[str, float] = {}
    with LoadSampler() as load:
        probabilities = np.array(zipf_probabilities(args.keys, args.s))
        rng = np.random.default_rng(args.seed)
        events1, ranks1 = draw(args.events, probabilities, rng, 0)
        append_events(root / "journal", args.partitions, events1)
        del events1
        keys = [key_name(r) for r in range(args.keys)]
        truth1 = rows_per_key_group(zip(keys, ranks1.tolist(), strict=True), MAX_KEY_GROUPS)
        say(f"phase 1: {args.events:,} events, Zipf s={args.s} over {args.keys:,} keys (hottest key {ranks1[0]:,})")

        from spark_runtime.session import spark_session

        t0 = time.monotonic()
        spark = spark_session("local[2]", CONF, app_name="taskshard-bench-skew")
        timings["sparkSession"] = time.monotonic() - t0

        # Phase 1: the parent [0, 128) with the load map, until it has consumed the journal.
        t0 = time.monotonic()
        parent = Shard(spark, root, "main", 0, MAX_KEY_GROUPS, args.partitions, None).start()
        scraped = parent.wait_load_map(journal_ends(root / "journal", args.partitions), args.events, timeout=900)
        timings["parentConsume"] = time.monotonic() - t0
        parent_map = scraped["load"]
        say(
            f"parent {parent.name}: caught up after {scraped['caughtUpSeconds']:.1f}s; load map {len(parent_map)} "
            f"buckets, {sum(parent_map.values()):,.0f} rows"
        )
        point = load_split_point(whole, parent_map)
        if point is None:
            raise RuntimeError("the parent's load map is empty: no load-aware split point")
        mid = whole.midpoint()
        mid_low, mid_high = split_rows(spread(parent_map, 0, MAX_KEY_GROUPS), mid)
        expected = {"by load": point.shares, "midpoint": (mid_low / point.rows, mid_high / point.rows)}
        say(f"by-load point {point.at} (expected shares {point.shares[0]:.3f} / {point.shares[1]:.3f}); midpoint {mid}")

        t0 = time.monotonic()
        summary = parent.drain("split (by load)")
        timings["parentDrain"] = time.monotonic() - t0
        manifest = parent.runner.paths.drained.uri()
        if not Path(manifest).exists():
            raise RuntimeError(f"the parent drained without {manifest}: {summary}")

        # Phase 2: new draws from the same distribution, then the two splits over the same input.
        events2, ranks2 = draw(phase2, probabilities, rng, args.events)
        append_events(root / "journal", args.partitions, events2)
        del events2
        truth2 = rows_per_key_group(zip(keys, ranks2.tolist(), strict=True), MAX_KEY_GROUPS)
        say(f"phase 2: {phase2:,} events appended")

        splits: dict[str, dict[str, Any]] = {}
        for mode, at, layout in (("by load", point.at, "main"), ("midpoint", mid, "midpoint")):
            if mode == "midpoint" and at == point.at:
                splits[mode] = {**splits["by load"], "sameAs": "by load"}
                continue
            t0 = time.monotonic()
            low, high = split_rows(truth2, at)
            splits[mode] = run_split(spark, root, layout, at, args.partitions, manifest, (int(low), int(high)))
            timings[f"split {mode}"] = time.monotonic() - t0
            c = splits[mode]["children"]
            say(f"{mode} split at {at}: children rows {c[0]['rows']:,.0f} / {c[1]['rows']:,.0f}")
        spark.stop()
    stat1 = cpu_times()
    wall = time.monotonic() - t_begin
    steal = (stat1[7] - stat0[7]) / max(1, sum(stat1) - sum(stat0)) if len(stat0) > 7 else None

    # ---------------------------------------------------------------- results
    total2 = sum(truth2)
    hot_kg = max(range(MAX_KEY_GROUPS), key=lambda g: truth2[g])
    from spark_runtime.keygroups import key_group

    hot_key_share = float(ranks2[0]) / total2
    best_at, best_imbalance = best_point(truth2)
    blocking = straddles_target(truth2)
    # For comparison, computed (not through an endpoint): the chooser on phase 1's exact rows per key group, i.e.
    # what a load map of one bucket per key group would have chosen, and what that point gives on phase 2.
    fine = load_split_point(whole, {(g, g + 1): float(n) for g, n in enumerate(truth1)})
    fine_at = fine.at if fine is not None else mid
    fine_imbalance = imbalance(*split_rows(truth2, fine_at))
    bucket = next(((a, b) for a, b in parent_map if a < point.at < b), None)
    rows_out = []
    results: dict[str, dict[str, Any]] = {}
    for mode, at in (("by load", point.at), ("midpoint", mid)):
        split = splits[mode]
        low, high = (c["rows"] for c in split["children"])
        value = imbalance(low, high)
        exact = all(c["rows"] == c["rowsByHash"] for c in split["children"])
        how = (
            "real split"
            + ("" if mode == "by load" else " (a second pair, same drained parent, own storage)")
            + "; rows = sum of each child's load map (its endpoint)"
            + ("; equal to the hash count" if exact else "; DIFFERENT from the hash count")
        )
        if split.get("sameAs"):
            how = "the same split as by load (the by-load point is the midpoint)"
        results[mode] = {
            "at": at,
            "expectedShares": [round(x, 4) for x in expected[mode]],
            "rows": [low, high],
            "measuredShares": [round(low / (low + high), 4), round(high / (low + high), 4)],
            "imbalance": round(value, 6),
            "matchesHashCount": exact,
            "how": how,
        }
        rows_out.append(
            [
                mode,
                at,
                f"[0, {at}) + [{at}, {MAX_KEY_GROUPS})",
                f"{expected[mode][0]:.3f} / {expected[mode][1]:.3f}",
                int(low),
                int(high),
                f"{low / (low + high):.3f} / {high / (low + high):.3f}",
                round(100 * value, 1),
                how,
            ]
        )
    columns = [
        "split",
        "point",
        "children",
        "expected shares (phase 1 load map)",
        "rows low child",
        "rows high child",
        "measured shares",
        "imbalance %",
        "how measured",
    ]
    by_load = results["by load"]
    width = "/".join(str(w) for w in sorted({b - a for a, b in parent_map}))
    met = by_load["imbalance"] <= TARGET
    title = (
        f"Split of [0, {MAX_KEY_GROUPS}) on Zipf keys (s = {args.s:g}, {args.keys:,} keys): {args.events:,} events "
        f"choose the point, {phase2:,} later events measured in the children; builtin count, local[2]"
    )
    summary_load = load.summary()
    print_table(title, columns, rows_out, summary_load)
    facts_columns = ["measure", "value"]
    facts = [
        ["phase 1 rows in the parent's load map (scraped) / events", f"{point.rows:,.0f} / {args.events:,}"],
        ["parent's load map: buckets with rows (key groups per bucket)", f"{len(parent_map)} ({width})"],
        ["phase 2 rows (events)", f"{total2:,}"],
        [
            "hottest key group in phase 2 (its share of the rows)",
            f"{hot_kg} ({pct(truth2[hot_kg] / total2)})",
        ],
        [
            "hottest key alone (its key group)",
            f"{key_name(0)}: {pct(hot_key_share)} (key group {key_group(key_name(0), MAX_KEY_GROUPS)})",
        ],
        ["best split point in hindsight on phase 2 (its imbalance)", f"{best_at} ({pct(best_imbalance)})"],
        [
            f"key groups that make <= {pct(TARGET)} unreachable (straddle the middle)",
            ", ".join(map(str, blocking)) or "none",
        ],
        [
            "by-load expected vs measured low share",
            f"{by_load['expectedShares'][0]:.3f} vs {by_load['measuredShares'][0]:.3f}",
        ],
        [
            "computed for comparison: the chooser on phase 1's rows per key group counted in Python (one bucket "
            "per key group), its point (phase 2 imbalance)",
            f"{fine_at} ({pct(fine_imbalance)})",
        ],
        ["wall time of the benchmark", f"{wall:.0f} s"],
        ["CPU steal during the run (/proc/stat)", pct(steal) if steal is not None else "not recorded"],
    ]
    facts_title = "The input and the load map"
    print_table(facts_title, facts_columns, facts)
    from spark_runtime.live import key_group_buckets
    from taskshard_operator.split_points import parse_bucket

    maps = [("parent (phase 1)", f"{TASK}-0-{MAX_KEY_GROUPS}", parent_map, truth1, 0, MAX_KEY_GROUPS)]
    for mode in ("by load", "midpoint"):
        if splits[mode].get("sameAs"):
            continue
        for c in splits[mode]["children"]:
            child_map = {parse_bucket(k): v for k, v in c["loadMap"].items()}
            maps.append((f"{mode} child (phase 2)", c["shard"], child_map, truth2, *c["keyGroups"]))
    errors_columns = [
        "shard",
        "name",
        "buckets",
        "buckets that differ",
        "largest differences (bucket: scraped vs hash)",
    ]
    errors_rows, errors_raw = [], {}
    for label, name, load_map, truth, a, b in maps:
        errs = map_errors(load_map, truth, a, b)
        errors_raw[name] = errs
        worst = sorted(errs, key=lambda e: -abs(e[1] - e[2]))[:4]
        errors_rows.append(
            [
                label,
                name,
                len(key_group_buckets(a, b)),
                len(errs),
                "; ".join(f"{k}: {got:,.0f} vs {want:,}" for k, got, want in worst) or "-",
            ]
        )
    errors_title = "The scraped load maps bucket by bucket, against the rows counted by hash"
    print_table(errors_title, errors_columns, errors_rows)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(
        spread(parent_map, 0, MAX_KEY_GROUPS),
        truth2,
        {"by load": point.at, "midpoint": mid},
        args.out / "split_skew.png",
        f"Split of [0, {MAX_KEY_GROUPS}), Zipf s = {args.s:g} over {args.keys:,} keys, {phase2:,} phase-2 rows\nby "
        f"load at {point.at}: children {pct(by_load['imbalance'])} apart; midpoint at {mid}: "
        f"{pct(results['midpoint']['imbalance'])} apart (target <= {pct(TARGET)})",
    )
    hot_share = truth2[hot_kg] / total2
    parent_errors = errors_raw[f"{TASK}-0-{MAX_KEY_GROUPS}"]
    why = (
        f"the by-load point {point.at} was chosen from the parent's scraped load map (phase 1) and expected shares "
        f"{by_load['expectedShares'][0]:.3f} / {by_load['expectedShares'][1]:.3f}; the children got "
        f"{by_load['measuredShares'][0]:.3f} / {by_load['measuredShares'][1]:.3f} of phase 2"
    )
    if parent_errors:
        worst = sorted(parent_errors, key=lambda e: -abs(e[1] - e[2]))[:3]
        why += (
            f". That map differs from phase 1's rows counted by hash in {len(parent_errors)} of "
            f"{len(key_group_buckets(0, MAX_KEY_GROUPS))} buckets ("
            + ", ".join(f"{k}: {got:,.0f} scraped vs {want:,} counted" for k, got, want in worst)
            + "): rows of neighbouring buckets are reported under one of them (the runtime computes the map with "
            "Spark's histogram_numeric, which merges bins when it combines the partial histograms of a batch's "
            "partitions; table 3). On the rows counted by hash the chooser would have picked "
            f"{fine_at} ({pct(fine_imbalance)} on phase 2)"
        )
    if bucket is not None:
        why += (
            f". The point lies inside the bucket {bucket[0]}-{bucket[1]}, whose rows the chooser spreads evenly; "
            "counted by hash, phase 1 had "
            + " / ".join(f"{truth1[g]:,}" for g in range(*bucket))
            + " rows in its key groups"
        )
    why += f". The best point in hindsight ({best_at}) gives {pct(best_imbalance)} on phase 2"
    if blocking:
        why += (
            f": key group {', '.join(map(str, blocking))} straddles the middle of the rows (the hottest key group "
            f"holds {pct(hot_share)} of phase 2, its key {key_name(0)} alone {pct(hot_key_share)}), so no split "
            f"point between key groups can meet {pct(TARGET)} on this input; only splitting that key group could"
        )
    targets = [
        {
            "name": "skew: child input rows differ by (%)",
            "target": f"<= {TARGET * 100:.0f} %",
            "value": f"{100 * by_load['imbalance']:.1f} % (by load, at {point.at}; midpoint: "
            f"{100 * results['midpoint']['imbalance']:.1f} %)",
            "met": met,
            "why": why,
        }
    ]
    notes = [
        f"One Task, maxKeyGroups {MAX_KEY_GROUPS}, one shard [0, {MAX_KEY_GROUPS}) with "
        'spark.taskshard.keyGroupMetrics: "true" (the load map), builtin count, a journal of '
        f"{args.partitions} partitions; keys k0..k{args.keys - 1} drawn with P(rank k) ~ 1/k^{args.s:g} "
        f"(numpy default_rng({args.seed})); phase 1 = {args.events:,} events, phase 2 = {phase2:,} new draws.",
        "Every shard is a ShardRunner running its own run() loop (the pod's loop) in a thread of this process, "
        "all in one SparkSession (local[2]), each serving its metrics on a free port of 127.0.0.1.",
        "The load map is read as the operator reads it: a scrape of http://127.0.0.1:<metricsPort>/metrics, "
        f'{LOAD_MAP}{{key_groups="<a>-<b>"}} parsed with prometheus_client; the by-load point is '
        "taskshard_operator.split_points.load_split_point over the parent's whole phase-1 map (the operator uses "
        "the growth over its window; here the window is all of phase 1). Expected shares: the chooser's for the "
        "by-load point, the same map's rows left and right of the midpoint for the midpoint.",
        "Measured rows: the parent drains finally (drained.json) after phase 1; phase 2 is appended; then two "
        "children restore from restoreFrom.manifest = <parent dir>/drained.json and process phase 2, one pair for "
        "the by-load point and then one for the midpoint (a second storage and sink directory, the same drained "
        "parent and journal: a real split of an identical Task; the pairs never run at the same time). A child's "
        "input rows = the sum of its own load map (scraped from its endpoint once it consumed the journal); "
        "taskshard_shard_rows_total is not used, because a journal shard reads every event (it drops other key "
        "groups after the read) and a restored child's first batch also reads its seed.",
        "Cross-check: each child's rows equal the phase-2 events of its key groups counted in Python "
        "(spark_runtime.keygroups.key_group, Spark's pmod(hash(key), n) bit for bit): 'equal to the hash count' "
        "in the table. The plot's bars are those per-key-group counts. Table 3 compares every bucket of every "
        "scraped load map with them (a child's rows are the sum of its map, which the runtime scales to the "
        "batch's count(1), so the sums agree even where buckets do not).",
        "imbalance = (larger - smaller) / larger (taskshard_operator.split_points.imbalance); target <= 15 % for "
        f"the by-load split. A key group whose rows begin below {pct((1 - TARGET) / (2 - TARGET))} of the total "
        f"and end above {pct(1 / (2 - TARGET))} makes the target unreachable for any point; a hot key group "
        "elsewhere, however large, does not.",
        "Timing (not a target): the wall time is mostly Spark's (session start, each shard's query start and "
        "first batches, the drains' snapshot exports); the numbers above do not depend on it.",
    ]
    write_result(
        args.out,
        "split_skew",
        {
            "title": "Load-aware split point on skewed keys",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out), "phase2_events": phase2},
            "machine": machine(),
            "load": summary_load,
            "tables": [
                {"title": title, "columns": columns, "rows": rows_out},
                {"title": facts_title, "columns": facts_columns, "rows": facts},
                {"title": errors_title, "columns": errors_columns, "rows": errors_rows},
            ],
            "targets": targets,
            "plots": ["split_skew.png"],
            "notes": notes,
            "raw": {
                "results": results,
                "point": {"at": point.at, "shares": list(point.shares), "rows": point.rows},
                "midpoint": mid,
                "parentLoadMap": {f"{a}-{b}": v for (a, b), v in sorted(parent_map.items())},
                "parentCaughtUpSeconds": scraped["caughtUpSeconds"],
                "phase1RowsPerKeyGroup": truth1,
                "phase2RowsPerKeyGroup": truth2,
                "hottestKeyGroup": {"keyGroup": hot_kg, "share": round(hot_share, 4)},
                "hottestKey": {
                    "key": key_name(0),
                    "share": round(hot_key_share, 4),
                    "keyGroup": key_group(key_name(0), MAX_KEY_GROUPS),
                },
                "bestInHindsight": {"at": best_at, "imbalance": round(best_imbalance, 4)},
                "chooserOnPerKeyGroupRows": {"at": fine_at, "phase2Imbalance": round(fine_imbalance, 4)},
                "pointInsideBucket": list(bucket) if bucket is not None else None,
                "blockingKeyGroups": blocking,
                "loadMapErrors": errors_raw,
                "splits": splits,
                "timings": {k: round(v, 2) for k, v in timings.items()},
                "wallSeconds": round(wall, 1),
                "stealPercent": round(100 * steal, 2) if steal is not None else None,
            },
        },
    )
    say(f"target <= {pct(TARGET)}: {'met' if met else 'MISSED'} ({pct(by_load['imbalance'])}); {wall:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
