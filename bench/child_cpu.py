"""Where a fresh split child's CPU time goes, from its process's start to its first committed batch.

A script, not a test. It builds a parent shard's state once (``--keys`` distinct keys, builtin count, drained to
a snapshot, in ``<out>/work/child_cpu``), then starts a child restoring half of the key groups as a fresh
``python -m spark_runtime run`` process, ``--repeat`` times per JVM option set (``--java-options``: the child's
whole ``spark.driver.extraJavaOptions``, one set per ``;``-separated entry; the empty entry is the runtime's
default, :data:`spark_runtime.session.DEFAULT_CONF`). While the child runs, every 0.25 s it reads the CPU
time of each of the child's JVM threads (grouped by thread name: JIT compilers, GC, Spark's task and stream
threads, ...) and of each Python process (the runtime, Spark's Python data source runners and worker daemons).

This is the work a split needs per child no matter how well it overlaps with the parent's drain: on a machine
with few cores it bounds the split latency from below (see ``bench/split_latency.py``, table 4).
Prints the tables and writes ``<out>/child_cpu.{json,png}``.

    .venv/bin/python bench/child_cpu.py --keys 50000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import restore_cost  # noqa: E402
from common import (  # noqa: E402
    DEFAULT_OUT,
    LoadSampler,
    command_line,
    descendants,
    machine,
    print_table,
    pyplot,
    say,
    spawn_runtime,
    write_result,
)
from proc_cpu import JIT_THREADS, cmdline, proc_stat  # noqa: E402

from spark_runtime.session import DEFAULT_CONF  # noqa: E402

PARTITIONS = 2
RUNTIME_DEFAULT = DEFAULT_CONF["spark.driver.extraJavaOptions"]
DEFAULT_SETS = ";-Xss32m -XX:CompileThresholdScaling=5;-Xss32m -XX:TieredStopAtLevel=1"
"""The runtime's default (HotSpot's JIT settings), later JIT compilation, and C1 only."""
CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
THREAD_GROUPS = [
    ("JIT compilers (C1, C2)", JIT_THREADS),
    ("GC", ("GC Thread", "G1 ", "VM Thread", "VM Periodic")),
    ("Spark tasks", ("Executor task",)),
    ("stream execution", ("stream executio",)),  # thread names are cut to 15 characters
]
"""JVM threads by name prefix; the rest (the main thread, py4j's call threads, RPC, ...) is 'other JVM'."""
PYTHON_GROUPS = [
    ("Python: the runtime (driver)", "spark_runtime"),
    ("Python: data source runners", "python_streaming_source_runner"),
    ("Python: worker daemons and workers", "pyspark.daemon"),
]


def build_parent(root: Path, keys: int) -> str:
    """The parent's snapshot manifest (built once per ``root``)."""
    marker = root / "manifest.txt"
    if marker.exists():
        return marker.read_text()
    from spark_runtime.session import spark_session

    root.mkdir(parents=True, exist_ok=True)
    restore_cost.write_journal(root / "journal", keys, PARTITIONS, 1)
    spark = spark_session("local[2]", CONF)
    summary = restore_cost.build_parent(spark, root, PARTITIONS, CONF)
    spark.stop()
    marker.write_text(summary["manifest"])
    return summary["manifest"]


def thread_group(name: str) -> str:
    for label, prefixes in THREAD_GROUPS:
        if name.startswith(prefixes):
            return label
    return "other JVM"


def python_group(cmd: str) -> str:
    for label, needle in PYTHON_GROUPS:
        if needle in cmd:
            return label
    return "Python: other"


def run_child(root: Path, manifest: str, java_options: str, index: int) -> dict[str, Any]:
    """One fresh child process: start -> ``commits/0``; its CPU by group."""
    shard = f"child-{index}"
    conf = dict(CONF)
    if java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
    cfg = restore_cost.config(root, shard, 64, PARTITIONS, conf, {"parent": restore_cost.PARENT, "manifest": manifest})
    restore_cost.cleanup_child(root, shard)
    cfg_path = root / f"{shard}.json"
    cfg_path.write_text(json.dumps(cfg.to_json_dict()))
    commit0 = root / "state" / restore_cost.TASK / "shards" / shard / "checkpoint" / "commits" / "0"
    t0 = time.time()
    proc = spawn_runtime(cfg_path, root / f"{shard}.log")
    threads: dict[tuple[int, str], float] = {}
    processes: dict[tuple[int, str], float] = {}

    def sample() -> None:
        for pid in [proc.pid, *descendants(proc.pid)]:
            st = proc_stat(f"/proc/{pid}/stat")
            if st is None:
                continue
            if st[0] == "java":
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    ts = proc_stat(f"/proc/{pid}/task/{tid}/stat")
                    if ts is not None:
                        threads[(int(tid), ts[0])] = ts[1]
            else:
                processes[(pid, cmdline(pid))] = st[1]

    try:
        deadline = time.monotonic() + 600
        while not commit0.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"child {shard} exited with {proc.returncode}; see {root / shard}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"child {shard} did not commit batch 0 in 600 s")
            sample()
            time.sleep(0.25)
        sample()
        wall = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this script started; nothing to drain
        proc.wait(timeout=60)
    groups: dict[str, float] = {}
    for (_, name), cpu in threads.items():
        label = thread_group(re.sub(r"[-#\d\s]+$", "", name))
        groups[label] = groups.get(label, 0.0) + cpu
    for (_, cmd), cpu in processes.items():
        label = python_group(cmd)
        groups[label] = groups.get(label, 0.0) + cpu
    return {
        "wall": round(wall, 2),
        "jvm": round(sum(threads.values()), 2),
        "python": round(sum(processes.values()), 2),
        "pythonProcesses": sum(1 for (_, cmd) in processes if cmd.strip()),
        "groups": {k: round(v, 2) for k, v in groups.items()},
    }


def plot(rows: list[dict[str, Any]], labels: list[str], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.7 * len(rows)))
    for i, r in enumerate(rows):
        left = 0.0
        for j, label in enumerate(labels):
            width = r["groups"].get(label, 0.0)
            ax.barh(i, width, left=left, color=plt.cm.tab10(j), label=label if i == 0 else None)
            left += width
        ax.text(left + 0.3, i, f"{left:.1f} CPU s, wall {r['wall']:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["label"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("CPU seconds from the child's process start to its first committed batch (median)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys of the parent's state (default 50,000)")
    ap.add_argument("--repeat", type=int, default=2, help="children per JVM option set (default 2)")
    ap.add_argument(
        "--java-options",
        default=DEFAULT_SETS,
        help="';'-separated sets of the child's whole spark.driver.extraJavaOptions (the empty set is the "
        f"runtime's default, {RUNTIME_DEFAULT!r}; default {DEFAULT_SETS!r})",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    root = args.out / "work" / "child_cpu" / f"keys-{args.keys}"
    option_sets = [o.strip() for o in args.java_options.split(";")]

    with LoadSampler() as load:
        say(f"parent state of {args.keys:,} keys in {root}")
        manifest = build_parent(root, args.keys)
        runs: dict[str, list[dict[str, Any]]] = {}
        index = 0
        for _ in range(args.repeat):
            for opts in option_sets:  # interleaved, so a burst of load hits every option set alike
                index += 1
                r = run_child(root, manifest, opts, index)
                say(
                    f"child with JVM options '{opts or 'default'}': wall {r['wall']:.1f} s, JVM {r['jvm']:.1f} CPU s, "
                    f"Python {r['python']:.1f} CPU s"
                )
                runs.setdefault(opts, []).append(r)
    labels = [g for g, _ in THREAD_GROUPS] + ["other JVM"] + [g for g, _ in PYTHON_GROUPS] + ["Python: other"]
    rows = []
    for opts, rs in runs.items():
        rows.append(
            {
                "label": opts or f"runtime default: {RUNTIME_DEFAULT}",
                "wall": statistics.median(r["wall"] for r in rs),
                "jvm": statistics.median(r["jvm"] for r in rs),
                "python": statistics.median(r["python"] for r in rs),
                "pythonProcesses": statistics.median(r["pythonProcesses"] for r in rs),
                "groups": {g: round(statistics.median(r["groups"].get(g, 0.0) for r in rs), 2) for g in labels},
            }
        )
    title = (
        f"A fresh split child restoring half of a {args.keys:,}-key state (builtin count, local[2]): CPU seconds "
        f"from process start to the first committed batch, median of {args.repeat}"
    )
    columns = ["JVM options", "wall s", "CPU s", "JVM", *labels, "Python processes"]
    table = [
        [
            r["label"],
            r["wall"],
            round(r["jvm"] + r["python"], 2),
            r["jvm"],
            *(r["groups"][g] for g in labels),
            r["pythonProcesses"],
        ]
        for r in rows
    ]
    summary = load.summary()
    print_table(title, columns, table, summary)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, labels, args.out / "child_cpu.png", title)
    write_result(
        args.out,
        "child_cpu",
        {
            "title": "Where a split child's CPU goes (informational)",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [{"title": title, "columns": columns, "rows": table}],
            "targets": [],
            "plots": ["child_cpu.png"],
            "notes": [
                "CPU seconds are user + system time from /proc (each JVM thread, each Python process), sampled "
                "every 0.25 s until the child's commits/0 exists; a Python process that exited between samples "
                "loses up to 0.25 s.",
                "'CPU s' does not depend on how much CPU the hypervisor steals the way wall time does: it is the "
                "work a split needs per child, however well it overlaps with the parent's drain.",
                "-XX:CompileThresholdScaling=5 makes HotSpot compile a method after 5x as many calls as usual, "
                "so start-up code that runs a few times is interpreted instead of compiled, while hot code still "
                "reaches C2; -XX:TieredStopAtLevel=1 (C1 only) removes the C2 compiler's work but makes hot code "
                "slower for the life of the shard. Neither is a default: with CompileThresholdScaling=5 the "
                "throughput benchmark (section 1) was not faster (builtin count 0.81x instead of 0.87x in one run), "
                "and C1 only was not measured there. A Task sets its own options through "
                "spec.spark.conf['spark.driver.extraJavaOptions'], which replace the runtime's default; keep -Xss32m.",
            ],
            "raw": {"runs": runs},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
