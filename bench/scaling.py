"""Scaling: total throughput of 1, 2 and 4 shards over the same input, and read amplification.

A script, not a test. The input (``--events`` events over ``--keys`` keys in ``--partitions`` journal partitions)
is generated once. For each shard count n, n shard processes (``python -m spark_runtime run --config ...``, the
command a shard pod runs; local[2] each, builtin count) tile ``[0, 128)`` and start on an **empty** journal; a
small warm-up input (``--warmup-events``) is appended and consumed, so JVM start, query start and the first
batches' one-off costs are over before anything is timed. Then the whole input is appended (one ``write`` per
partition) and the clock runs until every shard has committed a batch whose end positions are the journal's
ends (the ``checkpoint/commits/<N>`` mtime of that batch, the latest over the shards). The shards then drain
(SIGTERM) and exit.

Measured per shard count:

- throughput = input events / (append -> last shard caught up);
- read amplification from the shards' own records: bytes = the source positions each shard committed
  (``checkpoint/offsets``, summed over partitions and shards) / journal bytes; rows = the rows each shard's
  source delivered (Spark's ``numInputRows``, from the runtime's ``batch N: rows=...`` log lines) / input events.
  Each shard reads every partition and filters its key groups natively, so both are expected near n;
- CPU seconds of the shards' process trees (JVM + Python workers, /proc) over the timed window, per million
  input events;
- a result check: the per-key counts across the shards (``spark_runtime.results``) add up to the input.

Prints a table and writes ``<out>/scaling.{json,png}``.

    .venv/bin/python bench/scaling.py --events 1000000 --shards 1,2,4
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    LoadSampler,
    command_line,
    cpu_seconds,
    descendants,
    machine,
    mtime,
    print_table,
    pyplot,
    say,
    spawn_runtime,
    write_result,
)

TASK = "scale"
MAX_KEY_GROUPS = 128
BATCH_LINE = re.compile(r"batch (\d+): rows=(\d+)")


def write_input(path: Path, events: int, keys: int, partitions: int, seed: int) -> int:
    from spark_runtime.produce import append_lines, partition_for

    rng = random.Random(seed)
    buckets: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(events):
        key = f"k{rng.randrange(keys)}"
        buckets[partition_for(key, partitions)].append(f'{{"key":"{key}","amount":{rng.randrange(100)},"seq":{i}}}')
    return sum(append_lines(path, p, lines) for p, lines in buckets.items())


def ranges(n: int) -> list[tuple[int, int]]:
    step = MAX_KEY_GROUPS // n
    return [(i * step, MAX_KEY_GROUPS if i == n - 1 else (i + 1) * step) for i in range(n)]


class Shard:
    def __init__(self, root: Path, start: int, end: int, partitions: int, conf: dict[str, str], trigger: str) -> None:
        self.root = root
        self.name = f"{TASK}-{start}-{end}"
        self.dir = root / "state" / TASK / "shards" / self.name
        self.log_path = root / f"{self.name}.log"
        self.config = {
            "task": TASK,
            "shard": self.name,
            "maxKeyGroups": MAX_KEY_GROUPS,
            "keyGroups": {"start": start, "end": end},
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": str(root / "journal"), "partitions": partitions}},
            "sink": {"directory": {"path": str(root / "out"), "format": "jsonl"}},
            "storage": {"path": str(root / "state")},
            "spark": {"master": "local[2]", "conf": conf, "triggerInterval": trigger},
            "terminationMessagePath": str(root / f"termination-{self.name}.log"),
        }
        self.proc: subprocess.Popen | None = None
        self.caught_up: float | None = None

    def start(self) -> None:
        cfg = self.root / f"{self.name}.json"
        cfg.write_text(json.dumps(self.config))
        self.proc = spawn_runtime(cfg, self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def started(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"shard {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        return f"shard {self.name} started" in self.log()

    def check_caught_up(self, ends: dict[str, int]) -> bool:
        """True once a committed batch ends at ``ends``; records that commit's mtime."""
        from spark_runtime.checkpoint import last_committed_batch, read_offsets

        if self.caught_up is not None:
            return True
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"shard {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        ckpt = self.dir / "checkpoint"
        bid = last_committed_batch(ckpt)
        if bid < 0:
            return False
        try:
            positions = next(o for o in read_offsets(ckpt, bid) if isinstance(o, dict))
        except (OSError, StopIteration, ValueError):
            return False
        if positions == ends:
            self.caught_up = mtime(ckpt / "commits" / str(bid))
            return True
        return False

    def committed_bytes(self) -> int:
        from spark_runtime.checkpoint import last_committed_batch, read_offsets

        ckpt = self.dir / "checkpoint"
        positions = next(o for o in read_offsets(ckpt, last_committed_batch(ckpt)) if isinstance(o, dict))
        return sum(int(v) for v in positions.values())

    def rows_read(self) -> int:
        seen: dict[int, int] = {}
        for m in BATCH_LINE.finditer(self.log()):
            seen[int(m.group(1))] = int(m.group(2))
        return sum(seen.values())

    def stop(self, timeout: float = 300) -> int | None:
        """SIGTERM (a drain), then SIGKILL of the process group this script started if it does not exit."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=60)
        return self.proc.returncode


def append_all(journal: Path, inputs: dict[int, bytes]) -> None:
    """Append each partition's bytes in one ``write`` (whole lines, ``O_APPEND``, like the producer)."""
    for p, data in inputs.items():
        fd = os.open(journal / f"p{p}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def journal_ends(journal: Path, partitions: int) -> dict[str, int]:
    return {f"p{p}.jsonl": file_size(journal / f"p{p}.jsonl") for p in range(partitions)}


def file_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def run_one(
    work: Path, n: int, inputs: dict[int, bytes], warmup: dict[int, bytes], args: argparse.Namespace, conf: dict
) -> dict:
    root = work / f"shards-{n}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "journal").mkdir(parents=True)
    shards = [Shard(root, s, e, args.partitions, conf, args.trigger) for s, e in ranges(n)]
    try:
        t_spawn = time.time()
        for s in shards:
            s.start()
        deadline = time.monotonic() + 600
        while not all(s.started() for s in shards):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} shards did not start within 600 s")
            time.sleep(0.2)
        startup = time.time() - t_spawn
        # Warm-up: a small input first, so the first batches' one-off costs (Python workers, RocksDB, code
        # generation) are paid before the clock runs.
        append_all(root / "journal", warmup)
        wait_caught_up(shards, journal_ends(root / "journal", args.partitions), args.timeout)
        for s in shards:
            s.caught_up = None
        time.sleep(args.settle)
        pids = [p for s in shards for p in descendants(s.proc.pid)]
        cpu0 = cpu_seconds(pids)
        # The clock starts with the append of the whole input, one write per partition file.
        t0 = time.time()
        append_all(root / "journal", inputs)
        wait_caught_up(shards, journal_ends(root / "journal", args.partitions), args.timeout)
        pids = sorted({*pids, *(p for s in shards for p in descendants(s.proc.pid))})
        cpu1 = cpu_seconds(pids)
        t1 = max(s.caught_up for s in shards)
        time.sleep(1.0)  # let each runtime's poll log its last batch line
    finally:
        codes = [s.stop() for s in shards]
    input_bytes = sum(len(d) for d in inputs.values()) + sum(len(d) for d in warmup.values())
    input_rows = args.events + args.warmup_events
    per_shard = [
        {
            "shard": s.name,
            "seconds": round(s.caught_up - t0, 3),
            "bytesRead": s.committed_bytes(),
            "rowsRead": s.rows_read(),
            "exitCode": code,
        }
        for s, code in zip(shards, codes, strict=True)
    ]
    from spark_runtime.results import final_results

    results = final_results(root / "out", root / "state", TASK)
    counted = sum(int(v) for v in results.values())
    seconds = t1 - t0
    out = {
        "shards": n,
        "startupSeconds": round(startup, 2),
        "seconds": round(seconds, 3),
        "eventsPerSecond": round(args.events / seconds, 1),
        "bytesRead": sum(p["bytesRead"] for p in per_shard),
        "rowsRead": sum(p["rowsRead"] for p in per_shard),
        "inputBytes": input_bytes,
        "readAmplificationBytes": round(sum(p["bytesRead"] for p in per_shard) / input_bytes, 3),
        "readAmplificationRows": round(sum(p["rowsRead"] for p in per_shard) / input_rows, 3),
        "cpuSeconds": round(cpu1 - cpu0, 2),
        "cpuSecondsPerMillion": round((cpu1 - cpu0) / args.events * 1e6, 2),
        "keys": len(results),
        "eventsCounted": counted,
        "exact": counted == input_rows,
        "perShard": per_shard,
    }
    shutil.rmtree(root / "out", ignore_errors=True)
    shutil.rmtree(root / "journal", ignore_errors=True)
    return out


def wait_caught_up(shards: list[Shard], ends: dict[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(s.check_caught_up(ends) for s in shards):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(shards)} shards did not catch up to {ends} within {timeout} s")
        time.sleep(0.1)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13, 4.2))
    ns = [r["shards"] for r in rows]
    a1.bar([str(n) for n in ns], [r["eventsPerSecond"] for r in rows], color="#1f77b4")
    for i, r in enumerate(rows):
        label = f"{r['eventsPerSecond']:,.0f}/s\n{r['speedup']:.2f}x"
        a1.text(i, r["eventsPerSecond"], label, ha="center", va="bottom", fontsize=8)
    a1.set_xlabel("shards (processes, local[2] each)")
    a1.set_ylabel("input events per second, all shards together")
    a1.set_ylim(0, max(r["eventsPerSecond"] for r in rows) * 1.3)
    a1.set_title("total throughput", fontsize=10)
    a2.plot(ns, ns, color="#999999", ls=":", label="expected: = shards")
    a2.plot(ns, [r["readAmplificationBytes"] for r in rows], marker="o", label="bytes read / input bytes")
    a2.plot(ns, [r["readAmplificationRows"] for r in rows], marker="x", ls="--", label="source rows / input events")
    a2.set_xticks(ns)
    a2.set_xlabel("shards")
    a2.set_ylabel("read amplification")
    a2.set_title("read amplification (measured)", fontsize=10)
    a2.legend(fontsize=8)
    a3.bar([str(n) for n in ns], [r["cpuSecondsPerMillion"] for r in rows], color="#ff7f0e")
    for i, r in enumerate(rows):
        a3.text(i, r["cpuSecondsPerMillion"], f"{r['cpuSecondsPerMillion']:.0f}", ha="center", va="bottom", fontsize=8)
    a3.set_xlabel("shards")
    a3.set_ylabel("CPU seconds per 1M input events (all shards)")
    a3.set_title("CPU cost (JVMs + Python workers)", fontsize=10)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="input events (default 1,000,000)")
    ap.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    ap.add_argument("--partitions", type=int, default=4, help="journal partitions (default 4)")
    ap.add_argument("--shards", default="1,2,4", help="shard counts (default 1,2,4)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the input is cut into (default 10)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions per shard (default 4)")
    ap.add_argument("--trigger", default="200 milliseconds", help="trigger interval (default 200 milliseconds)")
    ap.add_argument("--warmup-events", type=int, default=20_000, help="untimed events first (default 20,000)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds to idle after start-up (default 3)")
    ap.add_argument("--timeout", type=float, default=900, help="per shard count (default 900 s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # paths go into configs and hostPath volumes
    counts = [int(n) for n in args.shards.split(",") if n.strip()]

    work = args.out / "work" / "scaling"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with LoadSampler() as load:
        t = time.perf_counter()
        nbytes = write_input(work / "input", args.events, args.keys, args.partitions, args.seed)
        inputs = {p: (work / "input" / f"p{p}.jsonl").read_bytes() for p in range(args.partitions)}
        write_input(work / "warmup", args.warmup_events, args.keys, args.partitions, args.seed + 1)
        warmup = {p: (work / "warmup" / f"p{p}.jsonl").read_bytes() for p in range(args.partitions)}
        inputs = {p: d for p, d in inputs.items() if d}
        took = time.perf_counter() - t
        say(f"input: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB in {took:.1f}s")
        conf = {
            "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
            "spark.ui.enabled": "false",
            "spark.taskshard.maxBytesPerTrigger": str(math.ceil(nbytes / args.batches) + 1024),
        }
        results = []
        for n in counts:
            say(f"{n} shard(s): starting")
            r = run_one(work, n, inputs, warmup, args, conf)
            results.append(r)
            say(
                f"{n} shard(s): {r['seconds']:.2f}s, {r['eventsPerSecond']:,.0f} events/s, read amplification "
                f"{r['readAmplificationBytes']:.2f} (bytes) {r['readAmplificationRows']:.2f} (rows), exact={r['exact']}"
            )
    base = next((r for r in results if r["shards"] == 1), results[0])
    for r in results:
        r["speedup"] = round(r["eventsPerSecond"] / base["eventsPerSecond"], 3)
    columns = [
        "shards",
        "append -> all caught up s",
        "input events/s (total)",
        "speedup vs 1",
        "source rows read",
        "read amp. (rows)",
        "bytes read (MB)",
        "read amp. (bytes)",
        "CPU s / 1M events",
        "counts exact",
    ]
    table = [
        [
            r["shards"],
            r["seconds"],
            r["eventsPerSecond"],
            r["speedup"],
            r["rowsRead"],
            r["readAmplificationRows"],
            round(r["bytesRead"] / 1e6, 1),
            r["readAmplificationBytes"],
            r["cpuSecondsPerMillion"],
            r["exact"],
        ]
        for r in results
    ]
    summary = load.summary()
    title = (
        f"Scaling: {args.events:,} events, {args.keys:,} keys, {nbytes / 1e6:.1f} MB in {args.partitions} partitions, "
        f"builtin count, local[2] per shard, {args.batches} batches"
    )
    print_table(title, columns, table, summary)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, args.out / "scaling.png", title)
    notes = [
        "Each shard is a separate python -m spark_runtime run process (the shard pod's command) with its own JVM "
        "and local[2]; all of them share this machine's cores, so n shards here measure the cost of sharding on one "
        "node, not a cluster's capacity.",
        "The timed window starts when the whole input is appended to the journal the shards already poll, after "
        "a warm-up input was consumed (start-up excluded; startupSeconds in the JSON) and ends at the mtime of "
        "the last shard's commit of the batch that reached the journal's end.",
        "Read amplification is measured from what each shard committed: bytes = its committed source positions, "
        "rows = numInputRows of its batches (the journal source delivers every valid line; the key-group filter "
        "runs natively in Spark after the source).",
        "CPU = user+system seconds of the shard process trees (JVM and Python workers) sampled at the window's "
        "start and end (/proc).",
    ]
    write_result(
        args.out,
        "scaling",
        {
            "title": "Scaling with shards and read amplification",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [{"title": title, "columns": columns, "rows": table}],
            "targets": [],
            "plots": ["scaling.png"],
            "notes": notes,
            "raw": {"inputBytes": nbytes, "results": results},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
