"""Load-aware split point on skewed keys: a ``by: load`` split of one shard next to a midpoint split, same input.

Each shard is a ``spark_runtime.shard.ShardRunner`` running the pod's ``run()`` loop in a thread of this process, all
in one SparkSession (local[2]), each serving its metrics on a free port of 127.0.0.1. One Task of 128 key groups,
builtin count, a journal of keys drawn with ``P(rank k) ~ 1/k^s`` (``--s`` over ``--keys`` keys).

Phase 1 (``--events``): the parent ``[0, 128)`` with the load map on (``spark.taskshard.keyGroupMetrics``), scraped
as the operator reads it (``taskshard_shard_key_group_rows_total``, parsed with prometheus_client). The by-load point
is ``load_split_point`` over the whole phase-1 map (the operator uses its growth over a window), the midpoint
``KeyGroupRange.midpoint()``; expected shares: the chooser's, and the map's rows on each side of the midpoint.

The parent drains (``drained.json``), phase 2 (``--phase2-events`` new draws) is appended, and two real splits run
one after the other (the midpoint's in its own storage and sink), their children restoring from ``drained.json``.
A child's input rows are the sum of its load map once it consumed the journal (not ``taskshard_shard_rows_total``: a
journal shard reads every event, a restored child's first batch its seed too), checked against its key groups'
events counted in Python (Spark's ``pmod(hash(key), n)``; the plot's bars); table 3 checks every bucket of every map
(the runtime scales a map to the batch's ``count(1)``, so the sums agree even where buckets do not).

Target: the by-load children's rows differ by <= 15 %, ``imbalance = (larger - smaller) / larger``; a key group whose
rows begin below 45.9 % of the total and end above 54.1 % makes it unreachable for any point. The wall time (not a
target) is mostly Spark's. Writes ``<out>/split_skew.{json,png}``.

    .venv/bin/python bench/split_skew.py --events 200000
"""

from __future__ import annotations

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
    LoadSampler,
    cpu_times,
    method_notes,
    options,
    parse,
    publish,
    pyplot,
    read_json,
    runner_config,
    say,
    target,
)

TASK = "skew"
MAX_KEY_GROUPS = 128
TARGET = 0.15
LOAD_MAP = "taskshard_shard_key_group_rows_total"
ROWS = "taskshard_shard_rows_total"
STEADY_SECONDS = 30.0
"""A load map that has not changed for this long after its shard caught up is final (even if it is off)."""
CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "spark.taskshard.keyGroupMetrics": "true"}
PARENT = f"{TASK}-0-{MAX_KEY_GROUPS}"
COUNT = {"builtin": "count"}


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
    """A Prometheus text scrape -> (the load map ``{(start, end): rows}``, the other values by sample name)."""
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

    total, left, best = sum(per_key_group), 0.0, None
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

    pairs = ((f"{a}-{b}", float(load.get((a, b), 0.0)), int(sum(truth[a:b]))) for a, b in key_group_buckets(start, end))
    return [(label, got, want) for label, got, want in pairs if abs(got - want) > 0.5]


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def journal_ends(journal: Path, partitions: int) -> dict[str, int]:
    paths = {f"p{p}.jsonl": journal / f"p{p}.jsonl" for p in range(partitions)}
    return {name: (path.read_bytes() if path.exists() else b"").rfind(b"\n") + 1 for name, path in paths.items()}


class Shard:
    """One shard runtime in this process: ``ShardRunner.run()`` in a thread (the pod's loop, with its metrics
    endpoint), the load map read back over HTTP."""

    def __init__(self, spark: Any, root: Path, layout: str, start: int, end: int, parts: int, restore: Any) -> None:
        from spark_runtime.shard import ShardRunner

        self.name, self.start_kg, self.end_kg, self.port = f"{TASK}-{start}-{end}", start, end, free_port()
        extra = {"task": TASK, "restoreFrom": restore, "trigger": "500 milliseconds", "metricsPort": self.port}
        extra["terminationMessagePath"] = str(root / layout / f"termination-{self.name}.log")
        cfg = runner_config(root / layout, root / "journal", parts, self.name, start, end, COUNT, CONF, **extra)
        self.runner, self.outcome, self.started = ShardRunner(cfg, spark), {}, 0.0
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)

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
        if error := self.outcome.get("error"):
            raise RuntimeError(f"shard {self.name} failed: {error!r}") from error

    def scrape(self) -> tuple[dict[tuple[int, int], float], dict[str, float]] | None:
        """The endpoint's load map and values; None before ``run()`` bound the port."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
                return parse_scrape(response.read().decode())
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    def positions(self) -> dict[str, int] | None:
        return read_json(self.runner.paths.progress).get("positions")

    def wait_load_map(self, ends: dict[str, int], expected_rows: int, timeout: float) -> dict[str, Any]:
        """Wait until the shard committed a batch at the journal's ``ends`` and its load map stopped growing (it sums
        to ``expected_rows``, or stayed the same for :data:`STEADY_SECONDS` after the shard caught up: a mismatch is
        reported, not hidden); returns the last scrape and when the shard caught up."""
        deadline, same_since = time.monotonic() + timeout, time.monotonic()
        caught_up: float | None = None
        last: tuple[dict, dict] | None = None
        while time.monotonic() < deadline:
            self.check()
            if caught_up is None and self.positions() == ends:
                caught_up = time.monotonic()
            scraped = self.scrape()
            if scraped is not None:
                if last is None or scraped[0] != last[0]:
                    same_since = time.monotonic()
                (load, values), last = scraped, scraped
                steady = time.monotonic() - max(same_since, caught_up or 0.0)
                if caught_up is not None and (sum(load.values()) == expected_rows or steady > STEADY_SECONDS):
                    return {"load": load, "values": values, "caughtUpSeconds": round(caught_up - self.started, 2)}
            time.sleep(0.25)
        raise RuntimeError(
            f"shard {self.name} did not consume the journal up to {ends} within {timeout:.0f} s "
            f"(positions {self.positions()}, load map sum {sum(last[0].values()) if last else None})"
        )

    def drain(self, reason: str, timeout: float = 300) -> dict[str, Any]:
        self.runner.request_drain(reason, final=True)
        self.thread.join(timeout=timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"shard {self.name} did not drain within {timeout:.0f} s")
        self.check()
        return self.outcome["summary"]


def draw(n: int, probabilities: Any, rng: Any, first_seq: int) -> tuple[list[dict[str, Any]], Any]:
    """``n`` events with Zipf-ranked keys; returns them and the rows per rank."""
    import numpy as np

    ranks = rng.choice(len(probabilities), size=n, p=probabilities)
    events = [{"key": key_name(int(r)), "seq": first_seq + i} for i, r in enumerate(ranks)]
    return events, np.bincount(ranks, minlength=len(probabilities))


def run_split(spark: Any, root: Path, layout: str, at: int, parts: int, manifest: str, expected: tuple) -> dict:
    """Children ``[0, at)`` and ``[at, 128)`` restored from the parent's drain summary, run until they have
    consumed the journal (phase 2); their load maps from their endpoints."""
    restore, t0 = {"parent": PARENT, "manifest": manifest}, time.monotonic()
    children = [Shard(spark, root, layout, a, b, parts, restore).start() for a, b in ((0, at), (at, MAX_KEY_GROUPS))]
    ends = journal_ends(root / "journal", parts)
    out: dict[str, Any] = {"at": at, "children": []}
    try:
        for child, rows in zip(children, expected, strict=True):
            scraped = child.wait_load_map(ends, rows, timeout=900)
            load = scraped["load"]
            c = {"shard": child.name, "keyGroups": [child.start_kg, child.end_kg], "rows": sum(load.values())}
            c |= {"rowsByHash": rows, "sourceRowsRead": scraped["values"].get(ROWS)}
            c |= {"loadMap": {f"{a}-{b}": v for (a, b), v in sorted(load.items())}}
            out["children"].append(c | {"startToCaughtUpSeconds": scraped["caughtUpSeconds"]})
        out["startToBothCaughtUpSeconds"] = round(time.monotonic() - t0, 2)
    finally:
        for child in children:
            if child.thread.is_alive():
                child.drain("benchmark done")
    return out


def plot(phase1_map: list[float], phase2_rows: list[int], points: dict[str, int], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.2))
    xs = list(range(len(phase2_rows)))
    ax.bar(xs, phase2_rows, width=0.85, color="#7aa6c2", label="phase 2 rows per key group (the children's input)")
    label, edges = "phase 1 load map, as scraped (2 key groups per bucket, spread)", [x - 0.5 for x in [*xs, len(xs)]]
    ax.step(edges, [*phase1_map, phase1_map[-1]], where="post", color="#555", lw=0.8, label=label)
    for i, (mode, at) in enumerate(points.items()):
        ax.axvline(at - 0.5, color={"by load": "#c0392b"}.get(mode, "#27ae60"), lw=1.6, ls="-" if i == 0 else "--")
        ax.text(at + 0.5, 0.96 - 0.07 * i, f"{mode}: at {at}", transform=ax.get_xaxis_transform(), fontsize=8)
    twin, total, acc = ax.twinx(), sum(phase2_rows) or 1, 0
    cumulative = [(acc := acc + r) / total for r in phase2_rows]
    twin.plot([x + 0.5 for x in xs], cumulative, color="#8e44ad", lw=0.9, label="cumulative share (phase 2)")
    twin.axhline(0.5, color="#8e44ad", lw=0.5, ls=":")
    twin.set_ylim(0, 1)
    twin.set_ylabel("cumulative share of rows")
    ax.set(xlim=(-1, len(xs)), xlabel="key group", ylabel="rows")
    ax.set_title(title, fontsize=9)
    (h1, l1), (h2, l2) = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def measure(args: Any, root: Path) -> dict[str, Any]:
    """Phase 1 and the parent, phase 2 and both splits (module docstring): what the tables are made of."""
    import numpy as np

    from spark_runtime.keygroups import KeyGroupRange
    from spark_runtime.produce import append_events
    from spark_runtime.session import spark_session
    from taskshard_operator.split_points import load_split_point

    m: dict[str, Any] = {"timings": {}, "phase2": args.phase2_events or args.events}
    keys, timings = [key_name(r) for r in range(args.keys)], m["timings"]
    probabilities, rng = np.array(zipf_probabilities(args.keys, args.s)), np.random.default_rng(args.seed)
    events, ranks = draw(args.events, probabilities, rng, 0)
    append_events(root / "journal", args.partitions, events)
    del events  # not held while the shards run
    m["truth1"] = rows_per_key_group(zip(keys, ranks.tolist(), strict=True), MAX_KEY_GROUPS)
    say(f"phase 1: {args.events:,} events, Zipf s={args.s} over {args.keys:,} keys (hottest key {ranks[0]:,})")
    t0 = time.monotonic()
    spark = spark_session("local[2]", CONF, app_name="taskshard-bench-skew")
    timings["sparkSession"], t0 = time.monotonic() - t0, time.monotonic()
    parent = Shard(spark, root, "main", 0, MAX_KEY_GROUPS, args.partitions, None).start()
    scraped = parent.wait_load_map(journal_ends(root / "journal", args.partitions), args.events, timeout=900)
    timings["parentConsume"] = time.monotonic() - t0
    m["map"], m["caughtUp"] = scraped["load"], scraped["caughtUpSeconds"]
    say(f"parent: caught up after {m['caughtUp']:.1f}s; load map {len(m['map'])} buckets")
    m["point"] = point = load_split_point(KeyGroupRange(0, MAX_KEY_GROUPS), m["map"])
    if point is None:
        raise RuntimeError("the parent's load map is empty: no load-aware split point")
    m["mid"] = mid = KeyGroupRange(0, MAX_KEY_GROUPS).midpoint()
    mid_low, mid_high = split_rows(spread(m["map"], 0, MAX_KEY_GROUPS), mid)
    m["expected"] = {"by load": point.shares, "midpoint": (mid_low / point.rows, mid_high / point.rows)}
    say(f"by-load point {point.at} (expected shares {point.shares[0]:.3f} / {point.shares[1]:.3f}); midpoint {mid}")
    t0 = time.monotonic()
    summary = parent.drain("split (by load)")
    timings["parentDrain"], manifest = time.monotonic() - t0, parent.runner.paths.drained.uri()
    if not Path(manifest).exists():
        raise RuntimeError(f"the parent drained without {manifest}: {summary}")
    events, ranks = draw(m["phase2"], probabilities, rng, args.events)  # phase 2: the same distribution
    append_events(root / "journal", args.partitions, events)
    del events
    m["truth2"] = rows_per_key_group(zip(keys, ranks.tolist(), strict=True), MAX_KEY_GROUPS)
    m["hotKeyRows"], m["splits"] = ranks[0], {}
    for mode, at, layout in (("by load", point.at, "main"), ("midpoint", mid, "midpoint")):
        if mode == "midpoint" and at == point.at:
            m["splits"][mode] = {**m["splits"]["by load"], "sameAs": "by load"}
            continue
        t0, (low, high) = time.monotonic(), split_rows(m["truth2"], at)
        m["splits"][mode] = run_split(spark, root, layout, at, args.partitions, manifest, (int(low), int(high)))
        timings[f"split {mode}"] = time.monotonic() - t0
        c = m["splits"][mode]["children"]
        say(f"{mode} split at {at}: children rows {c[0]['rows']:,.0f} / {c[1]['rows']:,.0f}")
    spark.stop()
    return m


def split_results(m: dict[str, Any]) -> tuple[dict[str, Any], list[list[Any]]]:
    """Per split (by load, midpoint): its point, expected and measured shares and imbalance; and the table rows."""
    from taskshard_operator.split_points import imbalance

    results, rows = {}, []
    for mode, at in (("by load", m["point"].at), ("midpoint", m["mid"])):
        split, expected = m["splits"][mode], m["expected"][mode]
        low, high = (c["rows"] for c in split["children"])
        exact = all(c["rows"] == c["rowsByHash"] for c in split["children"])
        how = "real split" + ("" if mode == "by load" else " (a second pair, same drained parent, own storage)")
        how += "; rows = sum of each child's load map (its endpoint)"
        how += "; equal to the hash count" if exact else "; DIFFERENT from the hash count"
        if split.get("sameAs"):
            how = "the same split as by load (the by-load point is the midpoint)"
        lo, hi, value = low / (low + high), high / (low + high), imbalance(low, high)
        results[mode] = {"at": at, "expectedShares": [round(x, 4) for x in expected], "rows": [low, high]}
        results[mode] |= {"measuredShares": [round(lo, 4), round(hi, 4)], "imbalance": round(value, 6)}
        results[mode] |= {"matchesHashCount": exact, "how": how}
        row = [mode, at, f"[0, {at}) + [{at}, {MAX_KEY_GROUPS})", f"{expected[0]:.3f} / {expected[1]:.3f}", int(low)]
        rows.append([*row, int(high), f"{lo:.3f} / {hi:.3f}", round(100 * value, 1), how])
    return results, rows


def map_checks(m: dict[str, Any]) -> tuple[list[list[Any]], dict[str, list]]:
    """Table 3: every scraped load map (the parent's, each child's) bucket by bucket against the hash count."""
    from spark_runtime.live import key_group_buckets
    from taskshard_operator.split_points import parse_bucket

    maps = [("parent (phase 1)", PARENT, m["map"], m["truth1"], 0, MAX_KEY_GROUPS)]
    for mode in ("by load", "midpoint"):
        for c in [] if m["splits"][mode].get("sameAs") else m["splits"][mode]["children"]:
            child_map = {parse_bucket(k): v for k, v in c["loadMap"].items()}
            maps.append((f"{mode} child (phase 2)", c["shard"], child_map, m["truth2"], *c["keyGroups"]))
    rows, errors = [], {}
    for label, name, load_map, truth, a, b in maps:
        errors[name] = errs = map_errors(load_map, truth, a, b)
        worst = sorted(errs, key=lambda e: -abs(e[1] - e[2]))[:4]
        text = "; ".join(f"{k}: {got:,.0f} vs {want:,}" for k, got, want in worst) or "-"
        rows.append([label, name, len(key_group_buckets(a, b)), len(errs), text])
    return rows, errors


def input_facts(m: dict[str, Any]) -> dict[str, Any]:
    """Phase 2's hottest key group and key, the best point in hindsight, what blocks the target, the bucket the point
    lies in, and (for comparison) the chooser on phase 1's rows per key group counted by hash."""
    from spark_runtime.keygroups import KeyGroupRange, key_group
    from taskshard_operator.split_points import imbalance, load_split_point

    truth2, total2 = m["truth2"], sum(m["truth2"])
    hot_kg = max(range(MAX_KEY_GROUPS), key=lambda g: truth2[g])
    best_at, best_imbalance = best_point(truth2)
    exact_map = {(g, g + 1): float(n) for g, n in enumerate(m["truth1"])}
    fine = load_split_point(KeyGroupRange(0, MAX_KEY_GROUPS), exact_map)
    fine_at = fine.at if fine is not None else m["mid"]
    fine_imbalance = imbalance(*split_rows(truth2, fine_at))
    hot_key, key_share = key_name(0), float(m["hotKeyRows"]) / total2
    return {
        "hottestKeyGroup": {"keyGroup": hot_kg, "share": round(truth2[hot_kg] / total2, 4)},
        "hottestKey": {"key": hot_key, "share": round(key_share, 4), "keyGroup": key_group(hot_key, MAX_KEY_GROUPS)},
        "bestInHindsight": {"at": best_at, "imbalance": round(best_imbalance, 4)},
        "chooserOnPerKeyGroupRows": {"at": fine_at, "phase2Imbalance": round(fine_imbalance, 4)},
        "pointInsideBucket": next(([a, b] for a, b in m["map"] if a < m["point"].at < b), None),
        "blockingKeyGroups": straddles_target(truth2),
    }


def why_missed(m: dict[str, Any], f: dict[str, Any], parent_errors: list) -> str:
    """A missed target's reason: the parent's map against the hash count, the bucket the point lies in, and what
    the best point could give (the numbers are in the findings and the tables)."""
    why = f"the by-load point {m['point'].at} came from the parent's scraped load map (phase 1)"
    if parent_errors:
        why += f", which differs from the hash count in {len(parent_errors)} buckets (table 3: Spark's "
        why += "histogram_numeric merges bins when it combines the partitions' partial histograms)"
    if f["pointInsideBucket"] is not None:
        a, b = f["pointInsideBucket"]
        counted = " / ".join(f"{m['truth1'][g]:,}" for g in range(a, b))
        why += f"; it lies inside the bucket {a}-{b}, whose rows the chooser spreads evenly (by hash: {counted})"
    best, blocking = f["bestInHindsight"], ", ".join(map(str, f["blockingKeyGroups"]))
    why += f"; the best point in hindsight ({best['at']}) gives {pct(best['imbalance'])} on phase 2"
    if blocking:
        why += f": key group {blocking} straddles the middle of the rows, so no point between key groups can meet "
        why += f"{pct(TARGET)} on this input; only splitting that key group could"
    return why


def report(args: Any, m: dict[str, Any]) -> dict[str, Any]:
    """The three tables, the target, the notes and the raw measurements."""
    results, rows = split_results(m)
    f, (map_rows, errors), by_load, point = input_facts(m), map_checks(m), results["by load"], m["point"]
    hot, key, best, fine = f["hottestKeyGroup"], f["hottestKey"], f["bestInHindsight"], f["chooserOnPerKeyGroupRows"]
    widths = "/".join(str(w) for w in sorted({b - a for a, b in m["map"]}))
    facts = [
        ["phase 1 rows in the parent's load map (scraped) / events", f"{point.rows:,.0f} / {args.events:,}"],
        ["parent's load map: buckets with rows (key groups per bucket)", f"{len(m['map'])} ({widths})"],
        ["phase 2 rows (events)", f"{sum(m['truth2']):,}"],
        ["hottest key group in phase 2 (its share of the rows)", f"{hot['keyGroup']} ({pct(hot['share'])})"],
        ["hottest key alone (its key group)", f"{key['key']}: {pct(key['share'])} (key group {key['keyGroup']})"],
        ["best split point in hindsight on phase 2 (its imbalance)", f"{best['at']} ({pct(best['imbalance'])})"],
        [f"key groups that make <= {pct(TARGET)} unreachable (straddle the middle)",
         ", ".join(map(str, f["blockingKeyGroups"])) or "none"],
        ["by-load expected vs measured low share",
         f"{by_load['expectedShares'][0]:.3f} vs {by_load['measuredShares'][0]:.3f}"],
        ["computed for comparison: the chooser on phase 1's rows per key group counted in Python (one bucket per "
         "key group), its point (phase 2 imbalance)", f"{fine['at']} ({pct(fine['phase2Imbalance'])})"],
        ["wall time of the benchmark", f"{m['wall']:.0f} s"],
        ["CPU steal during the run (/proc/stat)", pct(m["steal"]) if m["steal"] is not None else "not recorded"],
    ]  # fmt: skip
    title = (
        f"Split of [0, {MAX_KEY_GROUPS}) on Zipf keys (s = {args.s:g}, {args.keys:,} keys): {args.events:,} events "
        f"choose the point, {m['phase2']:,} later events measured in the children; builtin count, local[2]"
    )
    columns = ["split", "point", "children", "expected shares (phase 1 load map)", "rows low child", "rows high child"]
    columns += ["measured shares", "imbalance %", "how measured"]
    map_columns = ["shard", "name", "buckets", "buckets that differ", "largest differences (bucket: scraped vs hash)"]
    value = f"{100 * by_load['imbalance']:.1f} % (by load, at {point.at}; midpoint: "
    value += f"{100 * results['midpoint']['imbalance']:.1f} %)"
    why = why_missed(m, f, errors[PARENT])
    goal = target("skew: child input rows differ by (%)", "<= 15 %", value, by_load["imbalance"] <= TARGET, why)
    raw = {"results": results, "point": {"at": point.at, "shares": list(point.shares), "rows": point.rows}}
    raw |= {"midpoint": m["mid"], "parentLoadMap": {f"{a}-{b}": v for (a, b), v in sorted(m["map"].items())}}
    raw |= {"parentCaughtUpSeconds": m["caughtUp"], "phase1RowsPerKeyGroup": m["truth1"]}
    raw |= {"phase2RowsPerKeyGroup": m["truth2"], **f, "loadMapErrors": errors, "splits": m["splits"]}
    raw |= {"timings": {k: round(v, 2) for k, v in m["timings"].items()}, "wallSeconds": round(m["wall"], 1)}
    raw["stealPercent"] = round(100 * m["steal"], 2) if m["steal"] is not None else None
    tables = [
        (title, columns, rows),
        ("The input and the load map", ["measure", "value"], facts),
        ("The scraped load maps bucket by bucket, against the rows counted by hash", map_columns, map_rows),
    ]
    return {"title": "Load-aware split point on skewed keys", "tables": tables, "targets": [goal], "raw": raw}


def summarize(data: dict[str, Any]) -> list[str]:
    raw = data["raw"]
    load, mid = (raw["results"][k] for k in ("by load", "midpoint"))
    hot, best = raw["hottestKeyGroup"], raw["bestInHindsight"]
    blocking, wrong = ", ".join(map(str, raw.get("blockingKeyGroups") or [])), raw.get("loadMapErrors") or {}
    blocked = f" (key group {blocking} straddles the middle of the rows: no point between key groups meets 15 %)"
    out = [
        f"By load: split at {load['at']}, children's input rows {load['rows'][0]:,.0f} / {load['rows'][1]:,.0f}, "
        f"{load['imbalance']:.1%} apart (target <= 15 %: {'met' if load['imbalance'] <= 0.15 else 'missed'}); "
        f"midpoint {mid['at']}: {mid['rows'][0]:,.0f} / {mid['rows'][1]:,.0f}, {mid['imbalance']:.1%} apart.",
        f"Expected (parent's load map) vs measured (phase 2) share of the lower child: by load "
        f"{load['expectedShares'][0]:.3f} vs {load['measuredShares'][0]:.3f}, midpoint "
        f"{mid['expectedShares'][0]:.3f} vs {mid['measuredShares'][0]:.3f}.",
        f"The hottest key group ({hot['keyGroup']}) holds {hot['share']:.1%} of phase 2, its hottest key "
        f"{raw['hottestKey']['share']:.1%}; the best point in hindsight ({best['at']}) gives {best['imbalance']:.1%}"
        f"{blocked if blocking else ''}.",
    ]
    if wrong := wrong.get(PARENT):
        chooser = raw["chooserOnPerKeyGroupRows"]
        out.append(
            f"The parent's scraped load map differs from the hash count in {len(wrong)} buckets (table 3); on the "
            f"counted rows the chooser would have picked {chooser['at']} ({chooser['phase2Imbalance']:.1%} on phase 2)."
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=7)
    ap.add_argument("--events", type=int, default=200_000, help="phase 1 events (the load map; default 200,000)")
    ap.add_argument("--phase2-events", type=int, default=None, help="phase 2 events (default: --events)")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20,000)")
    ap.add_argument("--s", type=float, default=1.1, help="Zipf exponent (default 1.1)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    args = parse(ap, argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark_runtime.live import METRICS_HOST_ENV

    os.environ[METRICS_HOST_ENV] = "127.0.0.1"  # the endpoints bind this host's loopback only
    root = args.out / "work" / "split_skew"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t_begin, stat0 = time.monotonic(), cpu_times()
    with LoadSampler() as load:
        m = measure(args, root)
    stat1 = cpu_times()
    m["wall"] = time.monotonic() - t_begin
    m["steal"] = (stat1[7] - stat0[7]) / max(1, sum(stat1) - sum(stat0)) if len(stat0) > 7 else None
    args.phase2_events = m["phase2"]
    body = report(args, m)
    by_load, mid = body["raw"]["results"]["by load"]["imbalance"], body["raw"]["results"]["midpoint"]["imbalance"]
    title = (
        f"Split of [0, {MAX_KEY_GROUPS}), Zipf s = {args.s:g} over {args.keys:,} keys, {m['phase2']:,} phase-2 rows\n"
        f"by load at {m['point'].at}: children {pct(by_load)} apart; midpoint at {m['mid']}: {pct(mid)} apart "
        f"(target <= {pct(TARGET)})"
    )
    points = {"by load": m["point"].at, "midpoint": m["mid"]}
    plot(spread(m["map"], 0, MAX_KEY_GROUPS), m["truth2"], points, args.out / "split_skew.png", title)
    notes, plots = method_notes(__doc__), ["split_skew.png"]
    publish("split_skew", args, argv, load=load.summary(), plots=plots, notes=notes, **body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
