"""Run the TaskShard benchmarks one after another and render ``docs/benchmarks.md``: this module only orders and
renders; each benchmark's measurement and its ``summarize(data)`` (the "What the numbers say" lines) live in its
own script.

    .venv/bin/python bench/run_all.py            # full parameters (about an hour on 2 cores; splits take longest)
    .venv/bin/python bench/run_all.py --quick    # smaller inputs, fewer repeats (about 30 minutes)
    .venv/bin/python bench/run_all.py --only split,restore      # re-run some; the others' last results are kept
    .venv/bin/python bench/run_all.py --docs-only                # rebuild the page from the last results

Each benchmark runs in its own process (never two at once: they would measure each other) with the load average
sampled around it; it prints its tables and writes ``<out>/<result>.json`` (the shape in ``bench/common.py``) and
its plots. A failing benchmark is reported on the page and the others still run; the exit code is non-zero if any
failed. Results live in ``--out`` (default ``.run/bench``, not committed); the page and copies of the plots go to
``docs/benchmarks.md`` and ``docs/benchmarks/``. A benchmark with no results in ``--out`` (a fresh checkout has
none) keeps its section and Targets rows from the page as it was.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, LoadSampler, load_text, machine, md_table, options, parse, read_json, say  # noqa: E402

PY = ".venv/bin/python"
SPLIT_1M = ["--keys", "1000000", "--prefill", "3000000", "--steady-timeout", "1800", "--split-timeout", "1800"]
"""The split with 1,000,000 keys: the first batch of each Task holds the whole pre-fill (every key once, then random
ones), so the wait for a steady parent and the hand-over itself get more time than with 50,000 keys."""


class Bench(NamedTuple):
    """One section of the page: its number and key, the script, the result file it writes, and its arguments."""

    number: int
    key: str
    title: str
    script: str
    result: str
    full: list[str]
    quick: list[str]

    def summarize(self, data: dict[str, Any]) -> list[str]:
        """The script's ``summarize(data)``; no lines for a result of another shape (or a script without one)."""
        try:
            module = importlib.import_module(Path(self.script).stem)
            return list(module.summarize(data))
        except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError, StopIteration):
            return []


# fmt: off
ORDER = [
    Bench(1, "throughput", "Per-shard stateful throughput",
          "bench/shard_throughput.py", "shard_throughput",
          ["--repeat", "3"],
          ["--events", "500000", "--repeat", "2"]),
    Bench(2, "split", "Split latency",
          "bench/split_latency.py", "split_latency",
          ["--splits", "3"],
          ["--splits", "2"]),
    Bench(3, "restore", "Restore cost against slice size",
          "bench/restore_cost.py", "restore_cost",
          ["--keys", "1000000", "--repeat", "3"],
          ["--keys", "1000000", "--repeat", "1", "--fractions", "0.5,1"]),
    Bench(4, "scaling", "Scaling with shards and read amplification (read everything vs partition-nested)",
          "bench/scaling.py", "scaling",
          ["--events", "1000000", "--shards", "1,2,4,8"],
          ["--events", "300000", "--batches", "5", "--shards", "1,2,4,8"]),
    Bench(5, "operator", "Operator: reconciling 500 TaskShards",
          "bench/operator_scale.py", "operator_scale",
          ["--shards", "500", "--steady", "30"],
          ["--shards", "500", "--steady", "10"]),
    Bench(6, "kafka", "Kafka read amplification and CPU (issue 7; partition-nested: issue 15)",
          "bench/kafka_read_amplification.py", "kafka_read_amplification",
          ["--events", "200000", "--shards", "1,2,4,8"],
          ["--events", "50000", "--shards", "1,2,4,8"]),
    Bench(7, "split-chain", "Split latency with chained splits (informational)",
          "bench/split_latency.py", "split_latency_chain",
          ["--mode", "chain", "--splits", "3"],
          ["--mode", "chain", "--splits", "2"]),
    Bench(8, "child-cpu", "Where a split child's CPU goes (informational)",
          "bench/child_cpu.py", "child_cpu",
          ["--keys", "50000", "--repeat", "2"],
          ["--keys", "50000", "--repeat", "1"]),
    Bench(9, "split-1m", "Split latency with 1,000,000 keys of state",
          "bench/split_latency.py", "split_latency_1m",
          [*SPLIT_1M, "--splits", "2"],
          [*SPLIT_1M, "--splits", "1"]),
    Bench(10, "skew", "Load-aware split point on skewed keys",
          "bench/split_skew.py", "split_skew",
          ["--events", "200000", "--keys", "20000"],
          ["--events", "100000", "--keys", "20000"]),
    Bench(11, "executors", "Executors on Kubernetes against local mode",
          "bench/executors.py", "executors",
          ["--events", "300000", "--keys", "20000", "--repeat", "3"],
          ["--events", "100000", "--keys", "20000", "--repeat", "1"]),
    Bench(12, "merge", "Merge processing gap next to a split's",
          "bench/merge_gap.py", "merge_gap",
          ["--keys", "50000", "--trials", "2"],
          ["--keys", "50000", "--trials", "1"]),
    Bench(13, "autoscale", "Autoscaling on a 4x rate step",
          "bench/autoscale.py", "autoscale",
          ["--step", "720"],
          ["--step", "480", "--tail", "600"]),
    Bench(14, "state-layouts", "Python processor state layouts: per-batch cost against state size",
          "bench/state_layouts.py", "state_layouts",
          ["--keys", "100000,1000000,10000000"],
          ["--keys", "100000,1000000", "--per-key-max", "100000"]),
    Bench(15, "time", "Time in the processor: sessions, and exactness across hand-overs",
          "bench/time_engine.py", "time_engine",
          ["--repeat", "2"],
          ["--events", "300000", "--repeat", "1", "--exact-events", "60000"]),
    Bench(16, "windows", "Builtin windows: a tumbling-window count next to Spark's own",
          "bench/windows_throughput.py", "windows_throughput",
          ["--repeat", "3"],
          ["--events", "500000", "--keys", "50000", "--repeat", "1"]),
    Bench(17, "merge-kafka", "Split and merge processing gap on Kafka and MinIO",
          "bench/merge_gap.py", "merge_gap_kafka",
          ["--keys", "50000", "--trials", "2", "--source", "kafka", "--rate", "400", "--chain",
           "--jvm-options", "-Xss32m -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"],
          ["--keys", "50000", "--trials", "1", "--source", "kafka", "--rate", "400", "--chain"]),
]
# fmt: on
BENCHMARKS: dict[str, Bench] = {b.key: b for b in ORDER}


def run_one(bench: Bench, out: Path, quick: bool) -> dict[str, Any]:
    """Run one benchmark script, its output streamed to the console and ``<out>/logs/<name>.log``."""
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out  # the scripts run in the repository root
    cmd = [PY, bench.script, *(bench.quick if quick else bench.full), "--out", str(shown)]
    log_path = out / "logs" / f"{bench.key}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"{bench.key}: {shlex.join(cmd)}")
    t0 = time.time()
    with LoadSampler() as load, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if "WARN" not in line[:40] and not line.startswith(("\tat ", "java.", "Caused by")):
                print(f"  {bench.key} | {line}", end="", flush=True)
        code = proc.wait()
    status = {
        "name": bench.key,
        "command": shlex.join(cmd),
        "exitCode": code,
        "seconds": round(time.time() - t0, 1),
        "load": load.summary(),
        "log": str(log_path),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": quick,
    }
    (out / f"run-{bench.key}.json").write_text(json.dumps(status, indent=2) + "\n")
    say(f"{bench.key}: exit {code} after {status['seconds']:.0f}s")
    return status


# ---------------------------------------------------------------- the page


def section(bench: Bench, out: Path, docs_dir: Path) -> tuple[str, list[dict]]:
    """The markdown of one benchmark and its targets (copying its plots next to the page)."""
    status, data = read_json(out / f"run-{bench.key}.json"), read_json(out / f"{bench.result}.json")
    lines = [f"## {bench.number}. {bench.title}", ""]
    if status:
        lines += ["```sh", status["command"], "```", ""]
        lines += [
            f"Run {status['finished']} ({'quick' if status['quick'] else 'full'} parameters, {status['seconds']:.0f} s"
            f", exit code {status['exitCode']}); {load_text(status['load'])}.",
            "",
        ]
        if status["exitCode"] != 0:
            lines += [f"**This benchmark failed** (exit code {status['exitCode']}); its log: `{status['log']}`.", ""]
            lines += ["The results below are from an earlier run.", ""] if data else []
    if not data:
        lines += ["No results yet: run `make bench` (or the command above).", ""]
        return "\n".join(lines), []
    if not status and data.get("load"):
        lines.insert(2, f"{load_text(data['load'])}.\n")
    for t in data.get("tables") or []:
        lines += [f"**{t['title']}**", "", md_table(t["columns"], t["rows"]), ""]
    for p in data.get("plots") or []:
        if (out / p).exists():
            docs_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(out / p, docs_dir / p)
            lines += [f"![{bench.title}](benchmarks/{p})", ""]
    found = bench.summarize(data)
    if found:
        lines += ["What the numbers say:", ""] + [f"- {f}" if f and not f.startswith(("|", " ")) else f for f in found]
        lines += [""]
    targets = data.get("targets") or []
    missed = [t for t in targets if not t.get("met") and t.get("why")]
    if missed:
        lines += ["Targets missed, and what the time is spent on:", ""]
        lines += [f"- **missed**: {t['name']}: {t['value']} (target {t['target']}). {t['why']}." for t in missed]
        lines += [""]
    notes = data.get("notes") or []
    if notes:
        lines += ["How it is measured:", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines), targets


def previous_page(page: Path) -> tuple[dict[int, str], dict[int, list[list[Any]]]]:
    """The sections (``## N. ...`` up to the next ``## ``) and Targets rows of the page as it is now, by benchmark
    number: a benchmark whose results are not in ``--out`` (a fresh checkout has none) keeps them, so re-running
    some benchmarks never drops the others from the page."""
    try:
        text = page.read_text()
    except OSError:
        return {}, {}
    sections: dict[int, str] = {}
    rows: dict[int, list[list[Any]]] = {}
    for chunk in re.split(r"\n(?=## )", text):
        m = re.match(r"## (\d+)\. ", chunk)
        if m:
            sections[int(m.group(1))] = chunk.rstrip() + "\n"
        elif chunk.startswith("## Targets"):
            for line in chunk.splitlines():
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) == 5 and cells[0].isdigit():
                    rows.setdefault(int(cells[0]), []).append([int(cells[0]), *cells[1:]])
    return sections, rows


def write_docs(out: Path, page: Path, quick_default: bool) -> None:
    docs_dir = page.parent / "benchmarks"
    info = machine()
    old_sections, old_rows = previous_page(page)
    sections = []
    summary_rows = []
    for bench in ORDER:
        number = bench.number
        if not read_json(out / f"{bench.result}.json") and number in old_sections:
            head, _, rest = old_sections[number].partition("\n")
            kept = "_Kept from the previous version of this page: the results directory has none of this benchmark._"
            if kept not in rest:
                rest = f"\n{kept}\n{rest}"
            sections.append(f"{head}\n{rest}")
            summary_rows += old_rows.get(number, [])
            continue
        text, targets = section(bench, out, docs_dir)
        sections.append(text)
        for t in targets:
            summary_rows.append([number, t["name"], t["target"], t["value"], "met" if t.get("met") else "**missed**"])
    commands = "\n".join(f"{PY} {b.script} {shlex.join(b.full)}   # {b.number}. {b.title}" for b in ORDER)
    quick = "\n".join(f"{PY} {b.script} {' '.join(b.quick)}" for b in ORDER)
    machine_rows = [[k, v] for k, v in info.items() if k not in ("time",)]
    body = f"""# Benchmarks

Generated by `bench/run_all.py` ({info["time"]}, commit {info["commit"]}); do not edit by hand, re-run it.
Every number comes from a script under `bench/` that prints its table and writes JSON and a plot; none of them is a
timed assertion in the test suite. The machine is shared (other engineers' tests run at the same time), so each
section reports the load average during its run, and the headline numbers are ratios measured inside one run.

## Reproduce

```sh
make bench                       # = {PY} bench/run_all.py           (full parameters)
make bench QUICK=1               # = {PY} bench/run_all.py --quick   (smaller inputs, fewer repeats)
{PY} bench/run_all.py --only split,restore   # re-run some benchmarks; the page keeps the others' last results
{PY} bench/run_all.py --docs-only            # rebuild this page from the last results in .run/bench
```

Each benchmark alone (full parameters; every script has `--help`, and writes into `--out`, default `.run/bench`):

```sh
{commands}
```

The `--quick` parameters:

```sh
{quick}
```

The split latency, operator, executors and autoscale benchmarks start a local control plane and the operator
through `hack/operator_bed.py` (the bootstrap `make demo` uses; binaries from `make binaries`); the others need only
the venv (`make venv`) and Java 17; the Kafka ones start a broker and MinIO on loopback.

## Machine

{md_table(["", "value"], machine_rows)}
## Targets

{md_table(["#", "measurement", "target", "measured", "result"], summary_rows) if summary_rows else "No results yet."}
{chr(10).join(sections)}"""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(body.rstrip() + "\n")
    say(f"wrote {page} and the plots in {docs_dir}")


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=None)
    ap.add_argument("--quick", action="store_true", help="smaller inputs and fewer repeats")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--docs-only", action="store_true", help="only rebuild the page from the results in --out")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md", help="the page to write")
    args = parse(ap, argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    if unknown := [n for n in names if n not in BENCHMARKS]:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    failed = []
    if not args.docs_only:
        for name in names:
            status = run_one(BENCHMARKS[name], args.out, args.quick)
            if status["exitCode"] != 0:
                failed.append(name)
    write_docs(args.out, args.docs, args.quick)
    if failed:
        say(f"FAILED: {', '.join(failed)} (logs in {args.out / 'logs'})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
