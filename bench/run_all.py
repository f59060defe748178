"""Run every TaskShard benchmark and write ``docs/benchmarks.md`` (tables, plots, commands, machine, load).

    .venv/bin/python bench/run_all.py            # full parameters (about an hour on 2 cores; splits take longest)
    .venv/bin/python bench/run_all.py --quick    # smaller inputs, fewer repeats (about 30 minutes)
    .venv/bin/python bench/run_all.py --only split,restore      # re-run some; the others' last results are kept
    .venv/bin/python bench/run_all.py --docs-only                # rebuild the page from the last results

The benchmarks (issue 8), each a script that prints its table and writes JSON + PNG into ``--out``:

1. ``throughput``: ``bench/shard_throughput.py`` (per-shard throughput vs Spark's ``groupBy(key).count()``);
2. ``split``: ``bench/split_latency.py`` (the catch-up hand-over: processing gap, and split request -> both
   children emit, per phase; next to the previous protocol's numbers);
3. ``restore``: ``bench/restore_cost.py`` (restoring half of a 1M-key state vs all of it);
4. ``scaling``: ``bench/scaling.py`` (1, 2, 4, 8 shards, reading everything and partition-nested: throughput,
   read amplification, CPU per event, a model of shards on their own cores);
5. ``operator``: ``bench/operator_scale.py`` (500 TaskShards: time, peak memory, slowest handler call);
6. ``kafka``: ``bench/kafka_read_amplification.py`` (a real Kafka topic read by 1, 2, 4 and 8 shards, both modes);
7. ``split-chain``: ``bench/split_latency.py --mode chain`` (splits next to other running shards; informational);
8. ``child-cpu``: ``bench/child_cpu.py`` (a fresh split child's CPU by JVM thread and Python process; informational);
9. ``split-1m``: ``bench/split_latency.py --keys 1000000`` (the same split with 1,000,000 keys of state);
10. ``skew``: ``bench/split_skew.py`` (a ``by: load`` split of one shard on Zipf-distributed keys next to a
    midpoint split: the children's input rows).
11. ``executors``: ``bench/executors.py`` (one shard with 2 executor pods against local mode on the local control
    plane: exact results, events/s and CPU per event; on 2 cores this shows the executors' overhead).
12. ``merge``: ``bench/merge_gap.py`` (the processing gap of a merge next to a split's on the same state size).
13. ``autoscale``: ``bench/autoscale.py`` (``spec.autoscale`` on a 4x step of the input rate: rate, lag and shard
    count over time, exact results).
14. ``state-layouts``: ``bench/state_layouts.py`` (the Python processor's state layouts: per-batch time, CPU and
    changelog bytes at 100,000, 1,000,000 and 10,000,000 keys of state).
15. ``time``: ``bench/time_engine.py`` (the event-time session processor next to the Python count; a split and a
    merge in the middle of open sessions and pending timers, exact against a plain-Python sessionization).
16. ``windows``: ``bench/windows_throughput.py`` (a shard's builtin tumbling-window count next to Spark's own
    ``groupBy(window, key).count()`` over the same input, same output).
17. ``merge-kafka``: ``bench/merge_gap.py --source kafka`` (the processing gap of a split and of a merge on a real
    Kafka broker with state on MinIO, both started on loopback).

They run one after another (never two at once: they would measure each other), each in its own process, with
the load average sampled around it. A failing benchmark is reported on the page and the others still run; the
exit code is non-zero if any failed. Results live in ``--out`` (default ``.run/bench``, not committed); the page
and copies of the plots go to ``docs/benchmarks.md`` and ``docs/benchmarks/``. A benchmark with no results in
``--out`` (a fresh checkout has none) keeps its section and Targets rows from the page as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_OUT, REPO, LoadSampler, load_text, machine, md_table, say  # noqa: E402

PY = ".venv/bin/python"
SPLIT_1M = ["--keys", "1000000", "--prefill", "3000000", "--steady-timeout", "1800", "--split-timeout", "1800"]

BENCHMARKS: dict[str, dict[str, Any]] = {
    "throughput": {
        "number": 1,
        "title": "Per-shard stateful throughput",
        "script": "bench/shard_throughput.py",
        "result": "shard_throughput",
        "full": ["--repeat", "3"],
        "quick": ["--events", "500000", "--repeat", "2"],
    },
    "split": {
        "number": 2,
        "title": "Split latency",
        "script": "bench/split_latency.py",
        "result": "split_latency",
        "full": ["--splits", "3"],
        "quick": ["--splits", "2"],
    },
    "restore": {
        "number": 3,
        "title": "Restore cost against slice size",
        "script": "bench/restore_cost.py",
        "result": "restore_cost",
        "full": ["--keys", "1000000", "--repeat", "3"],
        "quick": ["--keys", "1000000", "--repeat", "1", "--fractions", "0.5,1"],
    },
    "scaling": {
        "number": 4,
        "title": "Scaling with shards and read amplification (read everything vs partition-nested)",
        "script": "bench/scaling.py",
        "result": "scaling",
        "full": ["--events", "1000000", "--shards", "1,2,4,8"],
        "quick": ["--events", "300000", "--batches", "5", "--shards", "1,2,4,8"],
    },
    "operator": {
        "number": 5,
        "title": "Operator: reconciling 500 TaskShards",
        "script": "bench/operator_scale.py",
        "result": "operator_scale",
        "full": ["--shards", "500", "--steady", "30"],
        "quick": ["--shards", "500", "--steady", "10"],
    },
    "kafka": {
        "number": 6,
        "title": "Kafka read amplification and CPU (issue 7; partition-nested: issue 15)",
        "script": "bench/kafka_read_amplification.py",
        "result": "kafka_read_amplification",
        "full": ["--events", "200000", "--shards", "1,2,4,8"],
        "quick": ["--events", "50000", "--shards", "1,2,4,8"],
    },
    "split-chain": {
        "number": 7,
        "title": "Split latency with chained splits (informational)",
        "script": "bench/split_latency.py",
        "result": "split_latency_chain",
        "full": ["--mode", "chain", "--splits", "3"],
        "quick": ["--mode", "chain", "--splits", "2"],
    },
    "child-cpu": {
        "number": 8,
        "title": "Where a split child's CPU goes (informational)",
        "script": "bench/child_cpu.py",
        "result": "child_cpu",
        "full": ["--keys", "50000", "--repeat", "2"],
        "quick": ["--keys", "50000", "--repeat", "1"],
    },
    "split-1m": {
        "number": 9,
        "title": "Split latency with 1,000,000 keys of state",
        "script": "bench/split_latency.py",
        "result": "split_latency_1m",
        # The first batch of each Task holds the whole pre-fill (every key once, then random ones): the wait for
        # the parent to get steady and the hand-over itself get more time than with 50,000 keys.
        "full": SPLIT_1M + ["--splits", "2"],
        "quick": SPLIT_1M + ["--splits", "1"],
    },
    "skew": {
        "number": 10,
        "title": "Load-aware split point on skewed keys",
        "script": "bench/split_skew.py",
        "result": "split_skew",
        "full": ["--events", "200000", "--keys", "20000"],
        "quick": ["--events", "100000", "--keys", "20000"],
    },
    "executors": {
        "number": 11,
        "title": "Executors on Kubernetes against local mode",
        "script": "bench/executors.py",
        "result": "executors",
        "full": ["--events", "300000", "--keys", "20000", "--repeat", "3"],
        "quick": ["--events", "100000", "--keys", "20000", "--repeat", "1"],
    },
    "merge": {
        "number": 12,
        "title": "Merge processing gap next to a split's",
        "script": "bench/merge_gap.py",
        "result": "merge_gap",
        "full": ["--keys", "50000", "--trials", "2"],
        "quick": ["--keys", "50000", "--trials", "1"],
    },
    "autoscale": {
        "number": 13,
        "title": "Autoscaling on a 4x rate step",
        "script": "bench/autoscale.py",
        "result": "autoscale",
        "full": ["--step", "720"],
        "quick": ["--step", "480", "--tail", "600"],
    },
    "state-layouts": {
        "number": 14,
        "title": "Python processor state layouts: per-batch cost against state size",
        "script": "bench/state_layouts.py",
        "result": "state_layouts",
        "full": ["--keys", "100000,1000000,10000000"],
        "quick": ["--keys", "100000,1000000", "--per-key-max", "100000"],
    },
    "time": {
        "number": 15,
        "title": "Time in the processor: sessions, and exactness across hand-overs",
        "script": "bench/time_engine.py",
        "result": "time_engine",
        "full": ["--repeat", "2"],
        "quick": ["--events", "300000", "--repeat", "1", "--exact-events", "60000"],
    },
    "windows": {
        "number": 16,
        "title": "Builtin windows: a tumbling-window count next to Spark's own",
        "script": "bench/windows_throughput.py",
        "result": "windows_throughput",
        "full": ["--repeat", "3"],
        "quick": ["--events", "500000", "--keys", "50000", "--repeat", "1"],
    },
    "merge-kafka": {
        "number": 17,
        "title": "Split and merge processing gap on Kafka and MinIO",
        "script": "bench/merge_gap.py",
        "result": "merge_gap_kafka",
        "full": ["--keys", "50000", "--trials", "2", "--source", "kafka"],
        "quick": ["--keys", "50000", "--trials", "1", "--source", "kafka"],
    },
}


def run_one(name: str, spec: dict[str, Any], out: Path, quick: bool) -> dict[str, Any]:
    """Run one benchmark script, its output streamed to the console and ``<out>/logs/<name>.log``."""
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out  # the scripts run in the repository root
    cmd = [PY, spec["script"], *(spec["quick"] if quick else spec["full"]), "--out", str(shown)]
    log_path = out / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    say(f"{name}: {' '.join(cmd)}")
    t0 = time.time()
    with LoadSampler() as load, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if "WARN" not in line[:40] and not line.startswith(("\tat ", "java.", "Caused by")):
                print(f"  {name} | {line}", end="", flush=True)
        code = proc.wait()
    status = {
        "name": name,
        "command": " ".join(cmd),
        "exitCode": code,
        "seconds": round(time.time() - t0, 1),
        "load": load.summary(),
        "log": str(log_path),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": quick,
    }
    (out / f"run-{name}.json").write_text(json.dumps(status, indent=2) + "\n")
    say(f"{name}: exit {code} after {status['seconds']:.0f}s")
    return status


# ---------------------------------------------------------------- the page


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def throughput_section(data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Item 1 from ``shard_throughput.json`` (the other script's own format, read defensively: every field
    may be missing in an older or newer version of it)."""
    results = data.get("results") or []
    baselines = {r.get("baseline") for r in results if r.get("baseline")} or {
        r.get("name") for r in results if str(r.get("name", "")).startswith("spark ")
    }
    has_cpu = any("cpuRatio" in r for r in results)
    columns = ["run", "compared with", "wall s", "median s", "events/s", "ratio", "batch-time ratio"]
    columns += ["CPU s", "CPU ratio"] if has_cpu else []
    columns += ["target (on the wall ratio)"]
    rows = []
    targets = []
    for r in results:
        name, target, met = r.get("name"), r.get("target"), r.get("meetsTarget")
        is_base = name in baselines
        ratio = r.get("ratio")
        rows.append(
            [
                name,
                "-" if is_base else r.get("baseline", "spark groupBy(key).count()"),
                r.get("seconds"),
                r.get("medianSeconds"),
                r.get("eventsPerSecond"),
                ratio,
                r.get("batchRatio"),
                *([r.get("cpuSeconds"), r.get("cpuRatio")] if has_cpu else []),
                "baseline" if is_base else (f">= {target}x: {'met' if met else 'MISSED'}" if target else "-"),
            ]
        )
        cost = r.get("keyGroupCountsCost")
        if isinstance(cost, int | float):
            goal = float(r.get("keyGroupCountsTarget") or 0.03)
            cpu = r.get("keyGroupCountsCpuCost")
            targets.append(
                {
                    "name": "per-key-group row counts (the load map, opt-in): throughput cost, builtin count, one run",
                    "target": f"<= {goal:.0%}",
                    "value": f"{cost:.1%} of the wall time"
                    + (f" ({cpu:.1%} of the CPU time)" if isinstance(cpu, int | float) else ""),
                    "met": cost <= goal,
                    "why": "the counts are Spark's observe() with one histogram_numeric over the bucket index; "
                    "observe() sits between the source and the aggregation outside whole-stage code generation, "
                    "so every input row is handed over one more time whatever it computes (64 conditional sums "
                    "cost 33 %, a histogram over a random eighth of the rows was no cheaper); off by default",
                }
            )
        if target is not None:
            targets.append(
                {
                    "name": f"{name} vs {r.get('baseline', 'spark groupBy(key).count()')}",
                    "target": f">= {target}x",
                    "value": f"{ratio:.2f}x" if isinstance(ratio, int | float) else str(ratio),
                    "met": bool(met),
                }
            )
    text = f"{data.get('environment', '')}\n\n" + md_table(columns, rows)
    return text, targets


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return (v[n // 2] + v[(n - 1) // 2]) / 2 if v else 0.0


def findings(key: str, data: dict[str, Any]) -> list[str]:
    """What the numbers of one benchmark say, computed from its JSON (so the page never drifts from the data).
    Best effort: a result file of another shape yields no findings rather than an error."""
    try:
        return _findings(key, data)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, StopIteration):
        return []


def _split_findings(data: dict[str, Any]) -> list[str]:
    """Sections 2, 7 and 9 (``bench/split_latency.py``: the catch-up hand-over)."""
    raw = data["raw"]
    results = raw["results"]
    out = []

    def med(values: list[Any]) -> float | None:
        present = [v for v in values if v is not None]
        return _median(present) if present else None

    def verdict(i: int) -> str:
        goals = data.get("targets") or []
        if i >= len(goals) or goals[i].get("target") == "reported":
            return "reported, no target"
        return f"target {goals[i]['target']}: {'met' if goals[i].get('met') else 'missed'}"

    gap = med([r["processingGap"] for r in results])
    total = _median([r["total"] for r in results])
    gap_text = f"{gap:.1f} s" if gap is not None else "not measured"
    out.append(
        f"Median processing gap {gap_text} ({verdict(0)}): from the parent's last committed batch to the later "
        "child's first emitting batch, while no shard produced output for the split range. Median "
        f"{total:.1f} s from the split request until both children emit ({verdict(1)})."
    )
    h = [r["handover"] for r in results]
    commits = med([x["commitsInWindow"] for x in h])
    window = med([x["windowSeconds"] for x in h])
    longest = med([x["longestCommitGap"] for x in h])
    cadence = med([x["commitIntervalBefore"] for x in h])
    if commits is not None and window is not None:
        text = (
            f"The parent kept processing during the hand-over: a median {commits:.0f} batches committed in the "
            f"{window:.1f} s from the request to its drained.json"
        )
        if longest is not None:
            text += f", the longest pause between two of its commits {longest:.1f} s"
        if cadence is not None:
            text += f" (one commit every {cadence:.1f} s before the request)"
        out.append(text + ".")
    groups = {g: _median([r["groups"][g] for r in results]) for g in results[0]["groups"]}
    ordered = sorted(groups.items(), key=lambda kv: -kv[1])
    out.append(
        "On the critical path (the child that emitted last), by group: "
        + ", ".join(f"{g} {v:.1f} s ({v / total:.0%})" for g, v in ordered if v)
        + ". Everything up to 'parent stop' overlaps with the parent's processing; only the end of 'parent stop' "
        "and 'take-over' fall inside the processing gap."
    )
    slow = [max(r["childTimes"].values(), key=lambda c: c.get("ready") or 0) for r in results]
    shadow = [med([c.get(k) for c in slow]) for k in ("shadowBatches", "shadowInterval", "parentIntervalInShadow")]
    if all(v is not None for v in shadow):
        out.append(
            f"Catch-up: the child that got ready last followed the parent for a median {shadow[0]:.0f} batches (one "
            f"every {shadow[1]:.1f} s, the parent one every {shadow[2]:.1f} s meanwhile) before one of its batches "
            "ended at the parent's latest committed positions as it had read them, which is when it writes its "
            "ready note."
        )
    keys = ("lastCommitToDrained", "drainedToEmit")
    parts = {k: med([x["gapParts"].get(k) for x in h if x["gapParts"].get(k) is not None]) for k in keys}
    if all(v is not None for v in parts.values()):
        out.append(
            f"The gap, piece by piece (medians): the parent's last commit -> its drained.json "
            f"{parts['lastCommitToDrained']:.1f} s, drained.json -> the later child's first emitting batch "
            f"committed {parts['drainedToEmit']:.1f} s (one batch: it reads up to the final positions and past "
            "them, and emits what lies past them)."
        )
    previous = raw.get("previous")
    if previous:
        busy = med([r["cpu"]["machine"]["busy"] for r in results if r.get("cpu")])
        out.append(
            f"Before and after: under the {previous['label']}, the processing gap was {previous['gap']:.1f} s, the "
            f"request -> both children's first batch {previous['total']:.1f} s, and a split cost "
            f"{previous['busy']:.0f} machine-busy CPU seconds; with the catch-up hand-over (this run, medians) "
            f"{gap_text}, {total:.1f} s"
            + (f" and {busy:.0f} CPU seconds" if busy is not None else "")
            + (
                f" (mean load average during the runs: {previous['load']:.1f} then, "
                f"{data['load']['during']['mean']:.1f} now)."
                if previous.get("load") is not None and data.get("load")
                else "."
            )
        )
    by_split = ", ".join(
        f"split {i + 1}: gap "
        + (f"{r['processingGap']:.1f} s" if r.get("processingGap") is not None else "-")
        + f", total {r['total']:.1f} s ({r.get('otherShards', i)} other shards running)"
        for i, r in enumerate(results)
    )
    out.append(f"By split: {by_split}.")
    steal = [r.get("stealPercent") for r in results if r.get("stealPercent") is not None]
    if steal:
        out.append(
            f"CPU steal by the hypervisor during the splits: {', '.join(f'{s:.0f}%' for s in steal)} of this VM's "
            "CPU time went to other guests (/proc/stat), which stretches every segment."
        )
    cpu = [r["cpu"] for r in results if r.get("cpu")]
    if cpu:
        busy = _median([c["machine"]["busy"] for c in cpu])
        idle = _median([c["machine"]["idle"] for c in cpu])
        parent = _median([c["groups"].get("parent JVM", 0.0) + c["groups"].get("parent Python", 0.0) for c in cpu])
        child = _median(
            [
                c["groups"].get(f"child {n} JVM", 0.0) + c["groups"].get(f"child {n} Python", 0.0)
                for c in cpu
                for n in (1, 2)
            ]
        )
        named = ("parent", "child 1", "child 2", "control plane", "node agent", "operator")
        other = _median([sum(v for k, v in c["groups"].items() if not k.startswith(named)) for c in cpu])
        cores = (data.get("machine") or {}).get("cores") or os.cpu_count() or 1
        out.append(
            f"CPU work until both children emit: a median {busy:.0f} machine-busy CPU seconds per split (idle "
            f"{idle:.1f} s), {parent:.0f} of them in the parent (it processes until the children are ready), "
            f"about {child:.0f} in each child (JVM, JIT and Python workers) and {other:.0f} in processes outside "
            f"the split (this benchmark's samplers, other work on the machine). On {cores} cores that much work "
            f"takes at least {busy / cores:.0f} s with no CPU stolen."
        )
    return out


def _executors_findings(data: dict[str, Any]) -> list[str]:
    """Section 11 (``bench/executors.py``: one shard with executor pods against the same shard in local mode)."""
    raw = data["raw"]
    summary, results = raw["summary"], raw["results"]
    params = data.get("parameters") or {}
    n = params.get("executors", 2)
    cores = (data.get("machine") or {}).get("cores") or os.cpu_count() or 1
    modes = summary["modes"]
    local, execs = modes.get("local"), modes.get("executors")
    ratios = summary["ratios"]
    out = []
    if local and execs and ratios.get("eventsPerSecond") is not None and ratios.get("cpuPerEvent") is not None:
        eps, cpu = ratios["eventsPerSecond"], ratios["cpuPerEvent"]
        out.append(
            f"With {n} executor pods the shard processed {params.get('events', 0):,} events at "
            f"{execs['eventsPerSecond']:,.0f} events/s against {local['eventsPerSecond']:,.0f} in local mode "
            f"({eps:.2f}x), at {execs['cpuMicrosPerEvent']:.1f} CPU µs per event against "
            f"{local['cpuMicrosPerEvent']:.1f} ({cpu:.2f}x; medians over {execs['runs']} and {local['runs']} runs, all "
            "processes of the shard's pods)."
        )
        share = execs.get("executorShare")
        if share is not None:
            out.append(
                f"The executor pods did {share:.0%} of the shard's CPU work in the timed window, the driver pod the "
                "rest: it still plans and commits every micro-batch (the journal source's offsets and pieces are "
                "computed in a Python process next to it); the reading, the aggregation and the state store updates "
                "run in the executors' tasks."
            )
        paired = ratios.get("paired") or []
        if paired:
            out.append(
                "Each repeat's pair (executors / local): "
                + ", ".join(
                    f"repeat {p['repeat']}: events/s {p['eventsPerSecond']:.2f}x, CPU per event {p['cpuPerEvent']:.2f}x"
                    for p in paired
                    if p.get("eventsPerSecond") is not None and p.get("cpuPerEvent") is not None
                )
                + "."
            )
        kinds = [k for k in ("JIT compilers", "GC", "other JVM", "Python") if k in (execs.get("cpuKinds") or {})]
        if kinds:
            out.append(
                "CPU seconds in the window by kind (medians), local mode / executors: "
                + ", ".join(
                    f"{k} {local['cpuKinds'].get(k) or 0:.1f} / {execs['cpuKinds'].get(k) or 0:.1f}" for k in kinds
                )
                + ". Each executor is a fresh JVM whose JIT compilers compile the same code again: that part of the "
                "difference is a start-up cost that shrinks as the JVMs run longer."
            )
        verdict = (
            f"here they were {1 - eps:.0%} slower and cost {cpu - 1:.0%} more CPU per event"
            if eps < 1 and cpu > 1
            else f"here the ratios were {eps:.2f}x (events/s) and {cpu:.2f}x (CPU per event)"
        )
        out.append(
            f"On this {cores}-core machine the executors compete with the driver for the same {cores} cores, so this "
            f"shows the overhead of executors, not a speed-up ({verdict}): each executor is one more JVM with its own "
            "Python workers, and the tasks, their results and the shuffle blocks travel between processes. Executors "
            "add task slots only where they get cores of their own (other nodes), for a range a split cannot divide "
            "(docs/executors.md)."
        )
    bad = [r for r in results if not r.get("exact")]
    if bad:
        out.append(
            "Results NOT exact in "
            + ", ".join(f"{r['mode']} repeat {r['repeat']}" for r in bad)
            + " (per-key counts against the plain-Python count): a correctness bug, see the run's JSON."
        )
    else:
        out.append(
            f"Results exact in all {len(results)} runs: the per-key counts equal the plain-Python count of the input."
        )
    out.append(f"CPU steal during the timed windows: {_steal(results)} of this VM's CPU time (/proc/stat).")
    return out


def _findings(key: str, data: dict[str, Any]) -> list[str]:
    raw = data.get("raw") or {}
    out = []
    if key in ("split", "split-chain", "split-1m"):
        out += _split_findings(data)
    elif key == "child-cpu":
        rows = raw["runs"]
        for opts, runs in rows.items():
            jvm = _median([r["jvm"] for r in runs])
            python = _median([r["python"] for r in runs])
            jit = _median([r["groups"].get("JIT compilers (C1, C2)", 0.0) for r in runs])
            out.append(
                f"With JVM options '{opts or 'default'}': {jvm + python:.1f} CPU s from the child's start to its first "
                f"batch ({jvm:.1f} in the JVM, of which {jit:.1f} in the JIT compilers; {python:.1f} in "
                f"{_median([r['pythonProcesses'] for r in runs]):.0f} Python processes); wall "
                f"{_median([r['wall'] for r in runs]):.1f} s."
            )
    elif key == "restore":
        rows = raw["rows"]
        half = next(r for r in rows if r["fraction"] == 0.5)
        out.append(
            f"Restoring half of the state costs {half['warmRatio']:.2f}x restoring all of it in wall time "
            f"({half['warmMedian']:.1f} s vs {next(r for r in rows if r['fraction'] == 1)['warmMedian']:.1f} s)"
            + (f" and {half['cpuRatio']:.2f}x in CPU time" if half.get("cpuRatio") is not None else "")
            + f"; target 0.6x: {'met' if half['warmRatio'] <= 0.6 else 'missed'}."
        )
        fits = raw.get("fits") or {}
        for label, f in fits.items():
            out.append(
                f"Fit for {label}: a fixed {f['fixed']:.1f} s plus {f['perFullState']:.1f} s for the whole state, "
                f"so half / all = {f['halfOverAll']:.2f} by the fit; the fixed part does not shrink with the slice."
            )
        out.append(
            f"A child reads only its key groups: {half['rows']:,} keys and {half['bytes'] / 1e6:.1f} MB for half "
            f"the range ({half['keyGroups']})."
        )
    elif key == "skew":
        res = raw["results"]
        load, mid = res["by load"], res["midpoint"]
        out.append(
            f"By load: split at {load['at']}, children's input rows {load['rows'][0]:,.0f} / {load['rows'][1]:,.0f}, "
            f"{load['imbalance']:.1%} apart (target <= 15 %: {'met' if load['imbalance'] <= 0.15 else 'missed'}); "
            f"midpoint {mid['at']}: {mid['rows'][0]:,.0f} / {mid['rows'][1]:,.0f}, {mid['imbalance']:.1%} apart."
        )
        out.append(
            "Expected shares (from the parent's load map) vs measured (phase 2): by load "
            f"{load['expectedShares'][0]:.3f} vs {load['measuredShares'][0]:.3f} for the lower child, midpoint "
            f"{mid['expectedShares'][0]:.3f} vs {mid['measuredShares'][0]:.3f}."
        )
        hot, best = raw["hottestKeyGroup"], raw["bestInHindsight"]
        out.append(
            f"The hottest key group ({hot['keyGroup']}) holds {hot['share']:.1%} of phase 2, its hottest key "
            f"{raw['hottestKey']['share']:.1%}; the best split point in hindsight ({best['at']}) gives "
            f"{best['imbalance']:.1%}"
            + (
                f" (key group {', '.join(map(str, raw['blockingKeyGroups']))} straddles the middle of the rows: no "
                "split point between key groups meets 15 % on this input)."
                if raw.get("blockingKeyGroups")
                else "."
            )
        )
        wrong = (raw.get("loadMapErrors") or {}).get("skew-0-128")
        if wrong:
            out.append(
                f"The parent's scraped load map differs from the rows counted by hash in {len(wrong)} buckets "
                f"(table 3); on the counted rows the chooser would have picked {raw['chooserOnPerKeyGroupRows']['at']} "
                f"({raw['chooserOnPerKeyGroupRows']['phase2Imbalance']:.1%} on phase 2)."
            )
    elif key == "scaling":
        out += _scaling_findings(raw)
    elif key == "executors":
        out += _executors_findings(data)
    elif key == "kafka":
        out += _kafka_findings(raw, (data.get("parameters") or {}).get("partitions") or 4)
    elif key == "operator":
        t = raw["timings"]
        passes = {k: v for k, v in t["handlers"].items() if k.startswith("pass:")}
        out.append(
            "Before the operator was rebuilt around the cache and the work queue (the same benchmark on this "
            "machine, previous round, under a load average of 18.6 from other work): reconciled after 198 s, the "
            "Task's handler call still running after 228 s, peak RSS 207 MiB, and 500 idle shards cost 25 % of a "
            "core and about 64 API requests/s (GETs of the shard, Task, pod and ConfigMap on every 3 s resync)."
        )
        out.append(
            f"{raw['shardsWithPhase']} TaskShards reconciled in {raw['reconciledSeconds']:.1f} s (all created after "
            f"{raw['allShardsCreatedSeconds']:.1f} s, all pods after {raw['allPodsSeconds']:.1f} s). Peak RSS "
            f"{raw['peakRssMiB']} MiB (idle {raw['rssIdleMiB']} MiB)."
        )
        if passes:
            parts = ", ".join(
                f"{k}: {v['calls']:,} passes, p50 {v['p50'] * 1000:.1f} ms, max {v['max'] * 1000:.0f} ms"
                for k, v in sorted(passes.items())
            )
            out.append(
                "Passes run on the work queue's threads and read the watch-fed cache (no GET of a watched object); "
                f"the Kopf handlers only enqueue keys. {parts}."
            )
        api = {x[0]: x for x in data["tables"][2]["rows"]}
        steady = sum(row[2] for row in api.values())
        out.append(
            f"Steady state with {raw['shardsWithPhase']} idle shards: {raw['cpuPercentSteady']}% of a core and "
            f"{steady} API calls in {raw['steadySeconds']:.0f} s."
        )
    return out


MODE_LABELS = {"everything": "read everything", "partitioned": "partition-nested"}


def _by_mode(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows per mode, by shard count (a result without a mode is from before issue 15: read everything)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        out.setdefault(r.get("mode", "everything"), []).append(r)
    return {m: sorted(rows, key=lambda r: r["shards"]) for m, rows in out.items()}


def _steal(rows: list[dict[str, Any]]) -> str:
    steal = [r["stealPercent"] for r in rows if r.get("stealPercent") is not None]
    return f"{min(steal):.1f}-{max(steal):.1f}%" if steal else "not recorded"


def _fit(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares ``CPU seconds = shared + shards * perShard`` over ``rows`` (None for fewer than 2 counts)."""
    pts = [(r["shards"], r["cpuSeconds"]) for r in rows]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return {"perShard": slope, "shared": my - slope * mx}


def _scaling_findings(raw: dict[str, Any]) -> list[str]:
    out = []
    modes = _by_mode(raw["results"])
    for mode, rows in modes.items():
        amps = ", ".join(f"{r['shards']}: {r['readAmplificationBytes']:.2f}" for r in rows)
        cpu = ", ".join(
            f"{r['shards']}: {r['cpuSecondsPerMillion']:.1f}"
            + (f" ({r['cpuRatio']:.2f}x)" if r.get("cpuRatio") is not None else "")
            for r in rows
        )
        out.append(
            f"{MODE_LABELS.get(mode, mode)}: read amplification (bytes read / input bytes, from committed source "
            f"positions; shards: value) {amps}; CPU seconds per million input events {cpu}."
        )
    every, nested = modes.get("everything", []), modes.get("partitioned", [])
    if every and nested and all("cpuMicrosPerOwnedEvent" in r for r in every + nested):
        e = ", ".join(f"{r['shards']}: {r['cpuMicrosPerOwnedEvent']['mean']:.0f}" for r in every)
        n = ", ".join(f"{r['shards']}: {r['cpuMicrosPerOwnedEvent']['mean']:.0f}" for r in nested)
        out.append(
            "CPU microseconds per owned event, per shard (mean over the shards): read everything "
            f"{e}; partition-nested {n}. Reading everything, a shard parses every event and drops the key groups "
            "it does not own, so its cost per owned event grows with the shard count; nested, it reads only its "
            "partitions."
        )
    models = [r for r in every + nested if (r.get("model") or {}).get("vsOneShard") is not None]
    if models:
        u = models[0]["model"]["coresPerShard"]
        parts = "; ".join(
            f"{MODE_LABELS[mode]}: "
            + ", ".join(
                f"{r['shards']}: {r['model']['eventsPerSecond']:,.0f}/s ({r['model']['vsOneShard']:.2f}x)"
                for r in rows
                if r.get("model", {}).get("eventsPerSecond")
            )
            for mode, rows in modes.items()
        )
        out.append(
            f"Model, not a measurement (table 2): if each shard had its own {u:.2f} cores (what one shard keeps busy "
            f"here), the shards together would reach {parts}. Measured on this 2-core machine, where all shards "
            "share the same cores, more shards cannot be faster than the cores allow: "
            + "; ".join(
                f"{MODE_LABELS[mode]} "
                + ", ".join(f"{r['shards']}: {r['speedup']:.2f}x" for r in rows if r.get("speedup") is not None)
                for mode, rows in modes.items()
            )
            + " the throughput of one shard."
        )
    partitions = raw.get("partitions") or 4
    once = [r for r in nested if r["shards"] <= partitions]
    fit = _fit(once)
    if fit:
        out.append(
            f"Partition-nested with at most one shard per partition ({', '.join(str(r['shards']) for r in once)} "
            f"shards: every event read once), the window's CPU fits {fit['shared']:.1f} s shared + "
            f"{fit['perShard']:.1f} s per shard (least squares): what each shard costs on top of the input's work "
            "(per-batch planning, state-store commits and the Python source runner, its idle polling at the 200 ms "
            "trigger, its own JVM's JIT compilation: table 4)."
        )
    split = [r.get("keysInTwoKeyGroups") for r in every + nested if r.get("keysInTwoKeyGroups") is not None]
    if split:
        out.append(
            f"Keys whose output records carry two key groups (a split key's state): {sum(split)} over all runs "
            "(the journal's producer keeps one key in one partition)."
        )
    out.append(f"CPU steal during the timed windows: {_steal(every + nested)} of this VM's CPU time (/proc/stat).")
    return out


def _kafka_findings(raw: dict[str, Any], partitions: int) -> list[str]:
    results = raw.get("results")
    if not isinstance(results, list):  # before issue 15: {"1": {...}, ..., "inputBytes": n}
        return []
    out = []
    modes = _by_mode(results)
    for mode, rows in modes.items():
        out.append(
            f"{MODE_LABELS.get(mode, mode)}: read amplification (bytes) "
            + ", ".join(f"{r['shards']}: {r['ampBytes']:.2f}" for r in rows)
            + "; CPU seconds per million events "
            + ", ".join(f"{r['shards']}: {r['cpuSecondsPerMillion']:.0f} ({r['cpuRatio']:.2f}x)" for r in rows)
            + "."
        )
    every = {r["shards"]: r for r in modes.get("everything", [])}
    nested = {r["shards"]: r for r in modes.get("partitioned", [])}
    once = [r for n, r in sorted(nested.items()) if n <= partitions]
    fit = _fit(once)
    if fit:
        text = (
            f"Partition-nested with at most one shard per partition ({', '.join(str(r['shards']) for r in once)} "
            f"shards: the topic read once), the CPU fits {fit['shared']:.1f} s shared + {fit['perShard']:.1f} s per "
            "shard run (least squares). The shards run one after another with the availableNow trigger, so every "
            "shard run pays its start and stop (preflight and Kafka metadata, start offsets, query start and "
            "planning, the commit); a long-running shard pays them once in its life."
        )
        if 1 in nested and 4 in nested:
            net1 = nested[1]["cpuSeconds"] - fit["perShard"]
            net4 = nested[4]["cpuSeconds"] - 4 * fit["perShard"]
            text += (
                f" Net of that fitted per-run cost (arithmetic on the fit, not a measurement), 4 shards vs 1: "
                f"{net4:.1f} vs {net1:.1f} CPU s ({net4 / net1:.2f}x)."
            )
        out.append(text)
    if every and nested:
        both = sorted(set(every) & set(nested))
        out.append(
            "Partition-nested vs read everything, CPU per event at the same shard count: "
            + ", ".join(f"{n}: {nested[n]['cpuSeconds'] / every[n]['cpuSeconds']:.2f}x" for n in both)
            + "."
        )
    out.append(f"CPU steal during the runs: {_steal(results)} of this VM's CPU time (/proc/stat).")
    return out


def scaling_guidance(data: dict[str, Any]) -> list[str]:
    """The scaling section's paragraph on the two modes: what reading everything costs (the measured table, both
    modes side by side) and when to declare ``partitionedByKey``. Empty for a result without both modes."""
    try:
        modes = _by_mode((data.get("raw") or {})["results"])
        every = {r["shards"]: r for r in modes["everything"]}
        nested = {r["shards"]: r for r in modes["partitioned"]}
    except (KeyError, TypeError):
        return []
    ns = sorted(set(every) | set(nested))

    def cell(rows: dict[int, dict[str, Any]], n: int, field: str) -> Any:
        return rows[n][field] if n in rows else None

    table = md_table(
        [
            "shards",
            "read amp. (bytes), read everything",
            "read amp. (bytes), partition-nested",
            "CPU s / 1M events, read everything",
            "CPU s / 1M events, partition-nested",
        ],
        [
            [
                n,
                cell(every, n, "readAmplificationBytes"),
                cell(nested, n, "readAmplificationBytes"),
                cell(every, n, "cpuSecondsPerMillion"),
                cell(nested, n, "cpuSecondsPerMillion"),
            ]
            for n in ns
        ],
    )
    partitions = (data.get("raw") or {}).get("partitions") or (data.get("parameters") or {}).get("partitions", 4)
    return [
        "**What reading everything costs, and when to declare `partitionedByKey`.** Without it every shard reads "
        "every partition and drops the key groups it does not own: read amplification equals the shard count, and "
        "so does the source work (parsing every event) per shard, so on one node more shards add CPU, not "
        f"capacity. Measured side by side ({partitions} partitions):",
        "",
        table,
        "Declare `source.journal.partitionedByKey: true` for a journal written by the runtime's producer "
        "(`spark_runtime.produce`, `append_events`: a key goes to partition `crc32(key) % partitions`), or "
        "`source.kafka.partitionedByKey: true` with `partitions: <the topic's partition count>` for a topic keyed "
        "by the key field (Kafka's default partitioner keeps one key in one partition), with `maxKeyGroups` a "
        "multiple of the partition count. Each shard then reads only the partitions whose key-group block meets "
        "its range: amplification 1 up to one shard per partition, and the number of shards per partition beyond "
        f"that (8 shards over {partitions} partitions read each partition twice), so give the topic at least as "
        "many partitions as the most shards the Task should ever run. The declaration is a promise about the "
        "producer: **one key, one partition**. A producer that breaks it (a custom partitioner, a record key "
        "other than the key field, records produced without a key, a hand-made partition count) puts one key's "
        "records into two key groups, possibly two shards; each keeps part of that key's state, so its per-key "
        "results are wrong (each shard's count is a part of the true one, and `results.final_results` keeps one of "
        "the records) and nothing fails. A changed partition count is caught (the shard stops with "
        "`PartitionCountChanged`); a misbehaving partitioner is not. To detect it: on the input, "
        "`groupBy(key).agg(countDistinct(partition))` must be 1 for every key (the Kafka benchmark counts the "
        "partitions of each key from its producer's delivery reports); on the output, a key whose sink records "
        "carry two `key_group` values had its state split (this benchmark counts them: `keysInTwoKeyGroups` in "
        "its JSON). Without that guarantee, keep the default: it is correct for any producer, at the read "
        "amplification above.",
        "",
    ]


def section(number: int, title: str, spec: dict[str, Any], out: Path, docs_dir: Path) -> tuple[str, list[dict]]:
    """The markdown of one benchmark and its targets (copying its plots next to the page)."""
    status = _read(out / f"run-{spec['key']}.json")
    data = _read(out / f"{spec['result']}.json")
    lines = [f"## {number}. {title}", ""]
    if status is not None:
        lines += [
            "```sh",
            status["command"],
            "```",
            "",
            f"Run {status['finished']} ({'quick' if status['quick'] else 'full'} parameters, {status['seconds']:.0f} s"
            f", exit code {status['exitCode']}); {load_text(status['load'])}.",
            "",
        ]
    if status is not None and status["exitCode"] != 0:
        lines += [f"**This benchmark failed** (exit code {status['exitCode']}); its log: `{status['log']}`.", ""]
        if data is not None:
            lines += ["The results below are from an earlier run.", ""]
    if data is None:
        lines += ["No results yet: run `make bench` (or the command above).", ""]
        return "\n".join(lines), []
    if spec["key"] == "throughput":
        text, targets = throughput_section(data)
        lines += [text, ""]
        plots = ["shard_throughput.png"]
        notes = [
            "Measured by `bench/shard_throughput.py` (its docstring has the method): one SparkSession, every kind "
            "once per round after a warm-up round; ratio = the baseline's wall time / the kind's wall time (count "
            "kinds against Spark's groupBy(key).count(), sum kinds against groupBy(key).sum(amount)); 'wall s' is "
            "the round the script reports (see the environment line), 'median s' the median over rounds.",
            "Load average: sampled by bench/run_all.py around the script (the script itself does not record it).",
        ]
    else:
        targets = data.get("targets") or []
        for t in data.get("tables") or []:
            lines += [f"**{t['title']}**", "", md_table(t["columns"], t["rows"]), ""]
        plots = data.get("plots") or []
        notes = data.get("notes") or []
        if status is None and data.get("load"):
            lines.insert(2, f"{load_text(data['load'])}.\n")
    for p in plots:
        src = out / p
        if src.exists():
            docs_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, docs_dir / p)
            lines += [f"![{title}](benchmarks/{p})", ""]
    found = findings(spec["key"], data)
    if found:
        lines += ["What the numbers say:", ""] + [f"- {f}" for f in found] + [""]
    missed = [t for t in targets if not t.get("met") and t.get("why")]
    if missed:
        lines += ["Targets missed, and what the time is spent on:", ""]
        lines += [f"- **missed**: {t['name']}: {t['value']} (target {t['target']}). {t['why']}." for t in missed]
        lines += [""]
    if spec["key"] == "scaling":
        lines += scaling_guidance(data)
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
    for key, spec in BENCHMARKS.items():
        number = spec["number"]
        if _read(out / f"{spec['result']}.json") is None and number in old_sections:
            head, _, rest = old_sections[number].partition("\n")
            kept = "_Kept from the previous version of this page: the results directory has none of this benchmark._"
            if kept not in rest:
                rest = f"\n{kept}\n{rest}"
            sections.append(f"{head}\n{rest}")
            summary_rows += old_rows.get(number, [])
            continue
        text, targets = section(number, spec["title"], {**spec, "key": key}, out, docs_dir)
        sections.append(text)
        for t in targets:
            summary_rows.append([number, t["name"], t["target"], t["value"], "met" if t.get("met") else "**missed**"])
    commands = "\n".join(
        f"{PY} {spec['script']} {' '.join(spec['full'])}   # {spec['number']}. {spec['title']}"
        for spec in BENCHMARKS.values()
    )
    quick = "\n".join(f"{PY} {spec['script']} {' '.join(spec['quick'])}" for spec in BENCHMARKS.values())
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

The split latency, operator and executors benchmarks start their own local control plane (`hack/localkube`,
binaries from `make binaries`); the others need only the venv (`make venv`) and Java 17.

## Machine

{md_table(["", "value"], machine_rows)}
## Targets

{md_table(["#", "measurement", "target", "measured", "result"], summary_rows) if summary_rows else "No results yet."}
{chr(10).join(sections)}"""
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(body.rstrip() + "\n")
    say(f"wrote {page} and the plots in {docs_dir}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs and fewer repeats")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    ap.add_argument("--docs-only", action="store_true", help="only rebuild the page from the results in --out")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md", help="the page to write")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.docs_only:
        for name in names:
            status = run_one(name, BENCHMARKS[name], args.out, args.quick)
            if status["exitCode"] != 0:
                failed.append(name)
    write_docs(args.out, args.docs, args.quick)
    if failed:
        say(f"FAILED: {', '.join(failed)} (logs in {args.out / 'logs'})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
