"""Scaling: throughput of 1, 2, 4 and 8 shard processes over the same journal input, read amplification and CPU
per event, with every shard reading every partition (``everything``) and with key groups nested in the partitions
(``partitioned``: ``partitionedByKey``, a shard reads only the partitions whose key-group block meets its range).
For each shard count and mode (interleaved), after a warm-up input and ``--settle`` idle seconds, the clock runs
from the append of the whole input until every shard committed the ends of its files; the notes say the rest.

    .venv/bin/python bench/scaling.py --events 1000000 --shards 1,2,4,8 --modes everything,partitioned
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LoadSampler, bar_plot, md_table, mtime, options, parse, publish, say, spawn_runtime, target  # noqa: E402
from proc_cpu import CPU_KINDS, MachineCpu, TreeCpu, machine_between  # noqa: E402

TASK = "scale"
MAX_KEY_GROUPS = 128
BATCH_LINE = re.compile(r"batch (\d+): rows=(\d+)")
MODES = {"everything": "read everything", "partitioned": "partition-nested"}  # --modes values and their labels
TARGETS = {"amp4": 1.05, "amp8": 2.1, "cpu4": 1.3}  # issue 15's, partition-nested: amplification, CPU 4 vs 1


def mode_options(doc: str | None, *, events: int, keys: int, seed: int) -> argparse.ArgumentParser:
    ap = options(doc, seed=seed)
    ap.add_argument("--events", type=int, default=events, help=f"input events (default {events:,})")
    ap.add_argument("--keys", type=int, default=keys, help=f"distinct keys (default {keys:,})")
    ap.add_argument("--partitions", type=int, default=4, help="journal or topic partitions (default 4)")
    ap.add_argument("--shards", default="1,2,4,8", help="shard counts (default 1,2,4,8)")
    what = "everything (every shard reads every partition), partitioned (partitionedByKey: true)"
    ap.add_argument("--modes", default="everything,partitioned", help=f"comma-separated: {what}; default both")
    return ap


def parse_modes(ap: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[int], list]:
    args = parse(ap, argv)
    counts = [int(n) for n in args.shards.split(",") if n.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: {unknown} unknown; choose from {list(MODES)}")
    if bad := [n for n in counts if n < 1 or MAX_KEY_GROUPS % n]:
        ap.error(f"--shards: {bad} must divide {MAX_KEY_GROUPS} (the shards tile [0, {MAX_KEY_GROUPS}) evenly)")
    if "partitioned" in modes and MAX_KEY_GROUPS % args.partitions:
        ap.error(f"--partitions: {args.partitions} must divide maxKeyGroups {MAX_KEY_GROUPS} with partitionedByKey")
    return args, counts, modes


def tiling(n: int) -> list[tuple[int, int]]:
    step = MAX_KEY_GROUPS // n
    return [(i * step, MAX_KEY_GROUPS if i == n - 1 else (i + 1) * step) for i in range(n)]


def owned_events(placed: Counter, n: int, partitions: int, nested: bool) -> list[int]:
    """The events each of ``n`` shards owns by the Task's mapping; ``placed``: (key, partition) -> events."""
    from spark_runtime.keygroups import KeyGrouping

    grouping = KeyGrouping(MAX_KEY_GROUPS, partitions if nested else None)
    out = [0] * n
    for (key, p), count in placed.items():
        out[min(grouping.of(key, p) // (MAX_KEY_GROUPS // n), n - 1)] += count
    return out


def shard_config(root: Path, task: str, shard: str, key_groups: tuple[int, int], source: dict, **extra: Any) -> dict:
    """A builtin-count shard writing under ``root``, no metrics port; ``extra`` adds or replaces keys."""
    sink = {"directory": {"path": str(root / "out"), "format": "jsonl"}}
    return (
        {"task": task, "shard": shard, "maxKeyGroups": MAX_KEY_GROUPS, "processor": {"builtin": "count"}}
        | {"keyGroups": {"start": key_groups[0], "end": key_groups[1]}, "source": source, "sink": sink}
        | {"storage": {"path": str(root / "state")}, "metricsPort": 0}
        | {"terminationMessagePath": str(root / f"termination-{shard}.log")}
        | extra
    )


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least squares ``y = fixed + slope * x`` (None without two distinct xs)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    if not (var := sum((x - mx) ** 2 for x in xs)):
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return my - slope * mx, slope


def fit_fixed_cost(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares ``CPU seconds = shared + shards * perShard`` over ``rows`` (None below 2 shard counts)."""
    fit = linear_fit([r["shards"] for r in rows], [r["cpuSeconds"] for r in rows]) if rows else None
    return {"perShard": round(fit[1], 2), "shared": round(fit[0], 2)} if fit else None


def read_once(rows: list[dict[str, Any]], mode: str, partitions: int) -> list[dict[str, Any]]:
    """The rows of ``mode`` that read the input once in total (nested: at most one shard per partition)."""
    once = [r for r in rows if r.get("mode", "everything") == mode]
    return once if mode == "everything" else [r for r in once if r["shards"] <= partitions]


def nested_targets(rows: list[dict], partitions: int, amp: Callable, cpu_why: Callable, label: str = "") -> list:
    """Issue 15's targets on the partition-nested rows: ``amp(row)`` (bytes read / input bytes) with 4 shards and
    with 8 over ``partitions``, and CPU per event with 4 shards vs 1 (``cpu_why(one, four)`` ends its why)."""
    nested = {r["shards"]: r for r in rows if r["mode"] == "partitioned"}
    out = []
    for n, limit in ((4, TARGETS["amp4"]), (8, TARGETS["amp8"])):
        over = "" if n == 4 else f" over {partitions} partitions"
        name, r = f"read amplification with {n} shards{over}, partition-nested{label}", nested.get(n)
        if r is None:
            out.append(target(name, f"<= {limit}", "not measured", False))
            continue
        reads = ", ".join(f"{p['shard']} read p{'+p'.join(map(str, p['partitions']))}" for p in r["perShard"])
        why = f"{reads}; {r['bytesRead']:,} bytes of {r['inputBytes']:,}"
        out.append(target(name, f"<= {limit}", f"{amp(r):.2f} (bytes)", amp(r) <= limit and r.get("correct", 1), why))
    name, one, four = f"CPU per million events, 4 shards vs 1, partition-nested{label}", nested.get(1), nested.get(4)
    if one is None or four is None:
        return [*out, target(name, f"<= {TARGETS['cpu4']}x", "not measured", False)]
    ratio = four["cpuSecondsPerMillion"] / one["cpuSecondsPerMillion"]
    extra = sorted(((four["cpuKinds"][k] - one["cpuKinds"][k], k) for k in CPU_KINDS), reverse=True)
    value = f"{ratio:.2f}x ({four['cpuSecondsPerMillion']:.1f} vs {one['cpuSecondsPerMillion']:.1f} CPU s / 1M events)"
    why = (
        f"4 shards used {four['cpuSeconds']:.1f} CPU s vs {one['cpuSeconds']:.1f} for 1 ("
        f"{four['cpuSeconds'] - one['cpuSeconds']:+.1f} s: {', '.join(f'{k} {v:+.1f}' for v, k in extra)}); "
        + cpu_why(one, four)
    )
    return [*out, target(name, f"<= {TARGETS['cpu4']}x", value, ratio <= TARGETS["cpu4"], why)]


def kinds_table(title: str, rows: list[dict], extra: tuple[str, str] | None = None) -> tuple[str, list, list]:
    """The "where the CPU went" table: mode, shards, CPU seconds by kind, the total (and ``(column, field)``)."""
    cols = ["mode", "shards", *[f"{k} s" for k in CPU_KINDS], "total CPU s", *(extra or ())[:1]]
    cells = [[MODES[r["mode"]], r["shards"], *[r["cpuKinds"][k] for k in CPU_KINDS], r["cpuSeconds"]] for r in rows]
    return title, cols, [c + [r[extra[1]]] if extra else c for c, r in zip(cells, rows, strict=True)]


def plot_amplification(results: list[dict], path: Path, amp: str, title: str) -> None:
    bars = {f"{MODES[r['mode']]}, {r['shards']} shard(s)": r[amp] for r in results}
    bar_plot(path, bars, xlabel="read amplification (bytes read / input bytes)", title=title)


def by_mode(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows per mode, by shard count (no mode: before issue 15, read everything)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(r.get("mode", "everything"), []).append(r)
    return {m: sorted(rows, key=lambda r: r["shards"]) for m, rows in out.items()}


def steal_text(rows: list[dict[str, Any]]) -> str:
    steal = [r["stealPercent"] for r in rows if r.get("stealPercent") is not None]
    return f"{min(steal):.1f}-{max(steal):.1f}%" if steal else "not recorded"


def mode_lines(modes: dict[str, list[dict[str, Any]]], amp: str, digits: int) -> list[str]:
    """Per mode: read amplification (bytes, field ``amp``) and CPU seconds per million events, by shard count."""

    def cpu(r: dict[str, Any]) -> str:
        ratio = f" ({r['cpuRatio']:.2f}x)" if r.get("cpuRatio") is not None else ""
        return f"{r['shards']}: {r['cpuSecondsPerMillion']:.{digits}f}{ratio}"

    return [
        f"{MODES.get(mode, mode)}: read amplification (bytes read / input bytes; shards: value) "
        + ", ".join(f"{r['shards']}: {r[amp]:.2f}" for r in rows)
        + f"; CPU s per million events {', '.join(cpu(r) for r in rows)}."
        for mode, rows in modes.items()
    ]


def write_input(path: Path, events: int, keys: int, partitions: int, seed: int) -> tuple[int, Counter]:
    """The journal files of ``events`` events (as the producer puts them); the bytes written, events per key."""
    from spark_runtime.produce import append_lines, partition_for

    rng = random.Random(seed)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    per_key: Counter = Counter()
    for i in range(events):
        key = f"k{rng.randrange(keys)}"
        per_key[key] += 1
        buckets[partition_for(key, partitions)].append(f'{{"key":"{key}","amount":{rng.randrange(100)},"seq":{i}}}')
    return sum(append_lines(path, p, lines) for p, lines in buckets.items()), per_key


def append_all(journal: Path, inputs: dict[int, bytes]) -> None:
    """Append each partition's bytes in one ``write`` (whole lines, ``O_APPEND``, like the producer)."""
    for p, data in inputs.items():
        with open(journal / f"p{p}.jsonl", "ab", buffering=0) as fh:
            fh.write(data)


def journal_ends(journal: Path, partitions: int) -> dict[str, int]:
    files = [journal / f"p{p}.jsonl" for p in range(partitions)]
    return {f.name: f.stat().st_size if f.exists() else 0 for f in files}


class Shard:
    """One shard process over ``[start, end)`` and what it committed."""

    def __init__(self, root: Path, start: int, end: int, partitions: int, conf: dict, trigger: str, nested: bool):
        from spark_runtime.config import parse_config

        self.root, self.name = root, f"{TASK}-{start}-{end}"
        self.ckpt = root / "state" / TASK / "shards" / self.name / "checkpoint"
        self.log_path = root / f"{self.name}.log"
        by_key = {"partitionedByKey": True} if nested else {}
        journal = {"path": str(root / "journal"), "partitions": partitions, **by_key}
        spark = {"master": "local[2]", "conf": conf, "triggerInterval": trigger}
        self.config = shard_config(root, TASK, self.name, (start, end), {"journal": journal}, spark=spark)
        read = parse_config(self.config).partitions_to_read  # the runtime's own answer
        self.partitions = list(range(partitions)) if read is None else read
        self.files = [f"p{p}.jsonl" for p in self.partitions]
        self.proc: subprocess.Popen | None = None
        self.caught_up: float | None = None
        self.at_catch_up: dict[str, Any] | None = None  # a TreeCpu reading when it was seen caught up
        self.idle_cores = 0.0

    def start(self) -> None:
        cfg = self.root / f"{self.name}.json"
        cfg.write_text(json.dumps(self.config))
        self.proc = spawn_runtime(cfg, self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"shard {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")

    def started(self) -> bool:
        self.alive()
        return f"shard {self.name} started" in self.log()

    def positions(self) -> tuple[int, dict[str, int]]:  # the last committed batch and its end positions
        from spark_runtime.checkpoint import last_committed_batch, read_offsets

        bid = last_committed_batch(self.ckpt)
        return bid, next(o for o in read_offsets(self.ckpt, bid) if isinstance(o, dict))

    def check_caught_up(self, ends: dict[str, int], cpu: TreeCpu | None = None) -> bool:
        """True once a committed batch ends at ``ends`` (of its files); records that commit's mtime and ``cpu``."""
        if self.caught_up is not None:
            return True
        self.alive()
        try:
            bid, positions = self.positions()
        except (OSError, StopIteration, ValueError):
            return False
        if bid < 0 or positions != {f: ends[f] for f in self.files}:
            return False
        self.caught_up = mtime(self.ckpt / "commits" / str(bid))
        self.at_catch_up = cpu.reading(threads=False) if cpu is not None else None
        return True

    def rows_read(self) -> int:
        return sum({int(m.group(1)): int(m.group(2)) for m in BATCH_LINE.finditer(self.log())}.values())


def drain(shards: list[Shard], timeout: float = 300) -> list[int | None]:
    """SIGTERM (a drain) to every shard at once, then their exit codes (SIGKILL of a group that does not exit)."""
    procs = [s.proc for s in shards if s.proc is not None]
    for p in (p for p in procs if p.poll() is None):
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)
    return [s.proc.returncode if s.proc is not None else None for s in shards]


def wait_caught_up(shards: list[Shard], ends: dict[str, int], timeout: float, cpu: TreeCpu | None = None) -> None:
    """Until every shard committed the ends of its files (all asked every round: each one's CPU read on time)."""
    deadline = time.monotonic() + timeout
    while not all([s.check_caught_up(ends, cpu) for s in shards]):  # noqa: C419 - ask every shard
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(shards)} shards did not catch up to {ends} within {timeout} s")
        time.sleep(0.1)


def timed_window(root: Path, shards: list[Shard], inputs: dict, warmup: dict, args: argparse.Namespace) -> dict:
    """Start, warm up, measure the idle CPU, append ``inputs``, wait for every catch-up: CPU readings, clock."""
    t_spawn, deadline = time.time(), time.monotonic() + 600
    for s in shards:
        s.start()
    while not all(s.started() for s in shards):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(shards)} shards did not start within 600 s")
        time.sleep(0.2)
    w: dict[str, Any] = {"startup": time.time() - t_spawn}
    # The warm-up pays the first batches' one-off costs (Python workers, RocksDB, code generation) untimed.
    append_all(root / "journal", warmup)
    wait_caught_up(shards, journal_ends(root / "journal", args.partitions), args.timeout)
    for s in shards:
        s.caught_up = None
    cpu = w["cpu"] = TreeCpu({s.name: s.proc.pid for s in shards if s.proc is not None}, interval=1.0)
    cpu.start()
    try:
        idle0 = cpu.reading(threads=False)  # idle: each query polls every trigger interval
        time.sleep(args.settle)
        idle1 = cpu.reading(threads=False)
        for s in shards:
            s.idle_cores = cpu.seconds(idle0, idle1, s.name) / args.settle
        w["before"], machine0 = cpu.reading(), MachineCpu()
        w["t0"] = time.time()  # the clock starts with the append of the whole input, one write per partition
        append_all(root / "journal", inputs)
        wait_caught_up(shards, journal_ends(root / "journal", args.partitions), args.timeout, cpu)
        w["after"], w["steal"] = cpu.reading(), machine_between(machine0, MachineCpu())
        w["t1"] = max(s.caught_up for s in shards)
        time.sleep(1.0)  # let each runtime's poll log its last batch line
    finally:
        cpu.stop()
    return w


def per_shard(s: Shard, code: int | None, own: int, w: dict[str, Any]) -> dict[str, Any]:
    cpu, before, after = w["cpu"], w["before"], w["after"]
    mine = cpu.seconds(before, s.at_catch_up, s.name)  # from the append to this shard's own catch-up
    return (
        {"shard": s.name, "partitions": s.partitions, "seconds": round(s.caught_up - w["t0"], 3)}
        | {"bytesRead": sum(int(v) for v in s.positions()[1].values()), "rowsRead": s.rows_read(), "ownedEvents": own}
        | {"cpuSeconds": round(cpu.seconds(before, after, s.name), 2), "cpuSecondsToCatchUp": round(mine, 2)}
        | {"cpuMicrosPerOwnedEvent": round(mine / own * 1e6, 2) if own else None}
        | {"eventsPerCpuSecond": round(own / mine, 1) if mine > 0 else None, "idleCores": round(s.idle_cores, 3)}
        | {"cpuKinds": cpu.kinds(before, after, s.name), "exitCode": code}
    )


def run_one(work: Path, mode: str, n: int, inputs: dict, warmup: dict, owned: list[int], args, conf: dict) -> dict:
    """n shards in ``mode``: the timed window, the drain, and the result check."""
    from spark_runtime.results import final_results, read_committed, read_sink

    root = work / f"{mode}-{n}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "journal").mkdir(parents=True)
    shards = [Shard(root, s, e, args.partitions, conf, args.trigger, mode == "partitioned") for s, e in tiling(n)]
    try:
        w = timed_window(root, shards, inputs, warmup, args)
    finally:
        codes = drain(shards)
    input_bytes = sum(len(d) for d in inputs.values()) + sum(len(d) for d in warmup.values())
    input_rows = args.events + args.warmup_events
    rows = [per_shard(s, code, own, w) for s, code, own in zip(shards, codes, owned, strict=True)]
    results = final_results(root / "out", root / "state", TASK)
    counted = sum(int(v) for v in results.values())
    # "One key, one partition" checked on the output: a key whose records carry two key groups had its state split.
    groups: dict[str, set[int]] = {}
    for rec in read_sink(root / "out", read_committed(root / "state", TASK)):
        groups.setdefault(rec["key"], set()).add(int(rec["key_group"]))
    shutil.rmtree(root / "out", ignore_errors=True)
    shutil.rmtree(root / "journal", ignore_errors=True)
    seconds, cpu, idle = w["t1"] - w["t0"], sum(p["cpuSeconds"] for p in rows), sum(s.idle_cores for s in shards)
    nbytes, nrows = sum(p["bytesRead"] for p in rows), sum(p["rowsRead"] for p in rows)
    micros = [p["cpuMicrosPerOwnedEvent"] for p in rows if p["cpuMicrosPerOwnedEvent"] is not None]
    micro = {"mean": round(sum(micros) / len(micros), 2) if micros else None}
    micro |= {"min": min(micros, default=None), "max": max(micros, default=None)}
    return (
        {"mode": mode, "shards": n, "startupSeconds": round(w["startup"], 2), "seconds": round(seconds, 3)}
        | {"eventsPerSecond": round(args.events / seconds), "bytesRead": nbytes, "rowsRead": nrows}
        | {"inputBytes": input_bytes, "readAmplificationBytes": round(nbytes / input_bytes, 3)}
        | {"readAmplificationRows": round(nrows / input_rows, 3), "cpuSeconds": round(cpu, 2)}
        | {"cpuSecondsPerMillion": round(cpu / args.events * 1e6, 2)}
        | {"cpuKinds": {k: round(sum(p["cpuKinds"].get(k, 0.0) for p in rows), 2) for k in CPU_KINDS}}
        | {"idleCores": round(idle, 3), "idleCpuInWindow": round(idle * seconds, 2)}
        | {"cpuMicrosPerOwnedEvent": micro}
        | {"machine": w["steal"], "stealPercent": w["steal"]["stealPercent"], "keys": len(results)}
        | {"eventsCounted": counted, "exact": counted == input_rows}
        | {"keysInTwoKeyGroups": sum(1 for g in groups.values() if len(g) > 1), "perShard": rows}
    )


def add_derived(results: list[dict[str, Any]], events: int) -> None:
    """Per mode: speedup and CPU ratio vs its 1-shard run, and the own-cores model (per shard owned events / CPU s,
    times ``u`` = CPU s / wall s of the 1-shard runs, both modes pooled; each mode's own ``u`` kept too)."""
    ones = [r for r in results if r["shards"] == 1]
    wall = sum(r["seconds"] for r in ones)
    u = sum(r["perShard"][0]["cpuSecondsToCatchUp"] for r in ones) / wall if wall > 0 else None
    for mode in MODES:
        rows = [r for r in results if r["mode"] == mode]
        one = next((r for r in rows if r["shards"] == 1), None)
        own_u = one["perShard"][0]["cpuSecondsToCatchUp"] / one["seconds"] if one and one["seconds"] > 0 else None
        for r in rows:
            r["speedup"] = round(r["eventsPerSecond"] / one["eventsPerSecond"], 3) if one else None
            r["cpuRatio"] = round(r["cpuSecondsPerMillion"] / one["cpuSecondsPerMillion"], 3) if one else None
            rates = [p["eventsPerCpuSecond"] for p in r["perShard"] if p["eventsPerCpuSecond"]]
            slowest = max(p["cpuSecondsToCatchUp"] for p in r["perShard"])
            r["model"] = (
                {"coresPerShard": round(u, 3) if u else None}
                | {"coresPerShardThisMode": round(own_u, 3) if own_u else None}
                | {"eventsPerCpuSecondPerShard": {"min": min(rates, default=None), "max": max(rates, default=None)}}
                | {"eventsPerCpuSecondSum": round(sum(rates)), "eventsPerSecond": round(u * sum(rates)) if u else None}
                | {"eventsPerSecondSlowestShard": round(u * events / slowest) if u and slowest > 0 else None}
            )
        base = one["model"]["eventsPerSecond"] if one else None
        for r in rows:
            m = r["model"]
            m["vsOneShard"] = round(m["eventsPerSecond"] / base, 2) if base and m["eventsPerSecond"] else None


def tables(results: list[dict[str, Any]], title: str) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The runs, the own-cores model, per shard, CPU by kind."""
    runs = [
        [MODES[r["mode"]], r["shards"], r["seconds"], r["eventsPerSecond"], r["speedup"], r["rowsRead"]]
        + [r["readAmplificationRows"], round(r["bytesRead"] / 1e6, 1), r["readAmplificationBytes"]]
        + [r["cpuSecondsPerMillion"], r["cpuRatio"], r["cpuMicrosPerOwnedEvent"]["mean"], r["stealPercent"], r["exact"]]
        for r in results
    ]
    model = []
    for r in results:
        m, rates = r["model"], r["model"]["eventsPerCpuSecondPerShard"]
        rate = f"{rates['min']:,.0f}-{rates['max']:,.0f}" if rates["min"] is not None else "-"
        model.append([MODES[r["mode"]], r["shards"], rate, m["eventsPerCpuSecondSum"], m["coresPerShard"]])
        model[-1] += [m["eventsPerSecond"], m["vsOneShard"], m["eventsPerSecondSlowestShard"], r["eventsPerSecond"]]
    shards = [
        [MODES[r["mode"]], r["shards"], p["shard"], ",".join(map(str, p["partitions"])), p["ownedEvents"]]
        + [p["rowsRead"], round(p["bytesRead"] / 1e6, 1), p["seconds"], p["cpuSecondsToCatchUp"]]
        + [p["cpuMicrosPerOwnedEvent"], p["idleCores"]]
        for r in results
        for p in r["perShard"]
    ]
    run_cols = (
        "mode|shards|append -> all caught up s|input events/s (total)|speedup vs 1|source rows read|read amp. (rows)|"
        "bytes read (MB)|read amp. (bytes)|CPU s / 1M events|CPU vs 1 shard|CPU us / owned event, per shard (mean)|"
        "CPU steal %|counts exact"
    )
    model_cols = (
        "mode|shards|per shard: events / CPU s (min-max)|sum over shards: events / CPU s|u: cores one shard keeps "
        "busy (1-shard runs)|model: events/s, each shard on its own cores (u x sum)|model vs 1 shard|model bounded "
        "by the slowest shard, events/s|measured here, events/s (shards share 2 cores)"
    )
    shard_cols = (
        "mode|shards|shard|partitions read|owned events|rows read|bytes read (MB)|caught up s|CPU s to catch up|"
        "CPU us / owned event|idle CPU (cores)"
    )
    idle = ("idle polling in the window s", "idleCpuInWindow")
    return [
        (title, run_cols.split("|"), runs),
        (f"{title}: Model: each shard on its own cores (not a measurement)", model_cols.split("|"), model),
        (f"{title}: Per shard (CPU from the append to the shard's own catch-up)", shard_cols.split("|"), shards),
        kinds_table(f"{title}: Where the window's CPU went (all shards)", results, idle),
    ]


def notes(args: argparse.Namespace) -> list[str]:
    block = MAX_KEY_GROUPS // args.partitions
    return [
        "Each shard is a python -m spark_runtime run process (local[2]); all share this machine's 2 cores, so the "
        "measured events/s is the cost of sharding on one node, not a cluster's capacity (table 2 models that). "
        f"Partition-nested: partition p of {args.partitions} holds key groups [p*{block}, (p+1)*{block}).",
        "The window runs from the append of the whole input (after a consumed warm-up) to the mtime of the last "
        "shard's commit of its files' ends. Read amplification: committed source positions (bytes), numInputRows "
        f"(rows); maxBytesPerTrigger = input / {args.batches} for every shard.",
        "CPU = user+system seconds of the shard process trees (/proc, proc_cpu.TreeCpu); per owned event: from the "
        "append to the shard's own catch-up. Steal % = the hypervisor's share of this VM's CPU time (/proc/stat). "
        "The own-cores model is arithmetic: u = CPU s / wall s of the 1-shard runs, aggregate = u x the sum of "
        "per-shard owned events / CPU s, bound = u x events / the largest per-shard CPU s.",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = mode_options(__doc__, events=1_000_000, keys=100_000, seed=5)
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions per shard (default 4)")
    ap.add_argument("--trigger", default="200 milliseconds", help="trigger interval (default 200 milliseconds)")
    ap.add_argument("--warmup-events", type=int, default=20_000, help="untimed events first (default 20,000)")
    ap.add_argument("--settle", type=float, default=3.0, help="idle seconds after the warm-up (default 3)")
    ap.add_argument("--timeout", type=float, default=900, help="per shard count (default 900 s)")
    args, counts, modes = parse_modes(ap, argv)
    from spark_runtime.produce import partition_for

    work = args.out / "work" / "scaling"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with LoadSampler() as load:
        nbytes, per_key = write_input(work / "input", args.events, args.keys, args.partitions, args.seed)
        write_input(work / "warmup", args.warmup_events, args.keys, args.partitions, args.seed + 1)
        inputs, warmup = (
            {p: (work / d / f"p{p}.jsonl").read_bytes() for p in range(args.partitions)} for d in ("input", "warmup")
        )
        inputs = {p: d for p, d in inputs.items() if d}
        placed = Counter({(k, partition_for(k, args.partitions)): c for k, c in per_key.items()})
        conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), "spark.ui.enabled": "false"}
        conf["spark.taskshard.maxBytesPerTrigger"] = str(math.ceil(nbytes / args.batches) + 1024)
        results = []
        for n in counts:
            for mode in modes:
                say(f"{MODES[mode]}, {n} shard(s): starting")
                owned = owned_events(placed, n, args.partitions, mode == "partitioned")
                results.append(r := run_one(work, mode, n, inputs, warmup, owned, args, conf))
                say(f"{r['seconds']:.2f}s, amplification {r['readAmplificationBytes']:.2f}, exact={r['exact']}")
    results.sort(key=lambda r: (list(MODES).index(r["mode"]), r["shards"]))
    add_derived(results, args.events)
    title = (
        f"Scaling: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB in {args.partitions} partitions, "
        f"builtin count, local[2] per shard, maxBytesPerTrigger = input / {args.batches}"
    )
    plot_amplification(results, args.out / "scaling.png", "readAmplificationBytes", title)

    def idle(one: dict[str, Any], four: dict[str, Any]) -> str:
        cores, window = (f"{four[k]:.2f} vs {one[k]:.2f}" for k in ("idleCores", "idleCpuInWindow"))
        return f"the shards' idle polling alone ({cores} cores) is about {window} s of it"

    fits = {m: fit_fixed_cost(read_once(results, m, args.partitions)) for m in modes}
    publish(
        "scaling",
        args,
        argv,
        title="Scaling with shards and read amplification",
        load=load.summary(),
        tables=tables(results, title),
        targets=nested_targets(results, args.partitions, lambda r: r["readAmplificationBytes"], idle),
        plots=["scaling.png"],
        notes=notes(args),
        raw={"inputBytes": nbytes, "partitionBytes": {p: len(d) for p, d in inputs.items()}}
        | {"partitions": args.partitions, "fixedCostFit": fits, "results": results},
    )
    return 0 if all(r["exact"] for r in results) else 1


def summarize(data: dict[str, Any]) -> list[str]:
    """The page's findings for ``scaling.json``, then when to declare ``partitionedByKey``."""
    modes, partitions = by_mode(data["raw"]["results"]), data["raw"].get("partitions") or 4
    every, nested = modes.get("everything", []), modes.get("partitioned", [])
    out = mode_lines(modes, "readAmplificationBytes", 1)
    if every and nested and all("cpuMicrosPerOwnedEvent" in r for r in every + nested):
        mean = {m: [f"{r['shards']}: {r['cpuMicrosPerOwnedEvent']['mean']:.0f}" for r in modes[m]] for m in MODES}
        us = {m: ", ".join(v) for m, v in mean.items()}
        out.append(
            f"CPU us per owned event, per shard (mean): read everything {us['everything']}; partition-nested "
            f"{us['partitioned']} (reading everything, a shard parses the events of the key groups it drops)."
        )
    if models := [r for r in every + nested if (r.get("model") or {}).get("vsOneShard") is not None]:
        reach, measured = [], []
        for mode, rows in modes.items():
            ms = [(r["shards"], r["model"]) for r in rows if (r.get("model") or {}).get("eventsPerSecond")]
            reach.append(
                f"{MODES[mode]}: "
                + ", ".join(f"{n}: {m['eventsPerSecond']:,.0f}/s ({m['vsOneShard']:.2f}x)" for n, m in ms)
            )
            measured.append(
                f"{MODES[mode]} " + ", ".join(f"{r['shards']}: {r['speedup']:.2f}x" for r in rows if r.get("speedup"))
            )
        reach, measured = "; ".join(reach), "; ".join(measured)
        out.append(
            f"Model, not a measurement (table 2): with {models[0]['model']['coresPerShard']:.2f} cores of its own "
            f"per shard (what one shard keeps busy here) the shards would reach {reach}. Measured here, all shards "
            f"sharing 2 cores: {measured} the throughput of one shard."
        )
    once = read_once(nested, "partitioned", partitions)
    if fit := fit_fixed_cost(once):
        out.append(
            f"Partition-nested with at most one shard per partition ({', '.join(str(r['shards']) for r in once)} "
            f"shards: every event read once), the window's CPU fits {fit['shared']:.1f} s shared + "
            f"{fit['perShard']:.1f} s per shard (least squares): each shard's own per-batch planning, state commits, "
            "source runner, idle polling at the 200 ms trigger and JIT compilation (table 4)."
        )
    if split := [r["keysInTwoKeyGroups"] for r in every + nested if r.get("keysInTwoKeyGroups") is not None]:
        out.append(f"Keys whose output records carry two key groups (a split key's state): {sum(split)} over all runs.")
    out.append(f"CPU steal during the timed windows: {steal_text(every + nested)} of this VM's CPU time (/proc/stat).")
    return out + guidance(modes, partitions)


def guidance(modes: dict[str, list[dict[str, Any]]], partitions: int) -> list[str]:
    """When to declare ``partitionedByKey``, with both modes side by side (nothing without both)."""
    if not modes.get("everything") or not modes.get("partitioned"):
        return []
    every, nested = ({r["shards"]: r for r in modes[m]} for m in MODES)
    fields = ("readAmplificationBytes", "cpuSecondsPerMillion")
    cols = ["shards"] + [f"{what}, {MODES[m]}" for what in ("read amp. (bytes)", "CPU s / 1M events") for m in MODES]
    ns = sorted(set(every) | set(nested))
    rows = [[n, *[(by.get(n) or {}).get(f) for f in fields for by in (every, nested)]] for n in ns]
    return [
        "**When to declare `partitionedByKey`.** Without it every shard reads every partition and drops the key "
        f"groups it does not own: on one node more shards add CPU, not capacity ({partitions} partitions):",
        "",
        md_table(cols, rows),
        "Declare `source.journal.partitionedByKey: true` for a journal of the runtime's producer, or "
        "`source.kafka.partitionedByKey: true` with `partitions: <the topic's partition count>` for a topic keyed by "
        "the key field (`maxKeyGroups` a multiple of it): a shard then reads only its partitions (amplification 1 up "
        "to one shard per partition: give the topic as many partitions as the most shards the Task may run). It "
        "promises **one key, one partition**: a producer breaking it (custom partitioner, other record key, no key) "
        "splits a key's state over two key groups and its results are silently wrong. Check `countDistinct(partition)` "
        "per key on the input, or `keysInTwoKeyGroups`; without that guarantee keep the default (any producer).",
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
