"""Where a fresh split child's CPU time goes, from its process's start to its first committed batch.

A parent's state of ``--keys`` keys is built once (``<out>/work/child_cpu``); then a child restoring half of its key
groups runs as a fresh ``python -m spark_runtime run`` process, ``--repeat`` times per JVM option set
(``--java-options``, ``;``-separated; the empty set is the runtime's default), while the CPU time of each of its JVM
threads (by name) and Python processes is read every 0.25 s: the work a split needs per child, however well it
overlaps with the parent's drain. Writes ``<out>/child_cpu.{json,png}``.

    .venv/bin/python bench/child_cpu.py --keys 50000 --repeat 2
"""

from __future__ import annotations

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
from common import LoadSampler, descendants, options, parse, publish, pyplot, say, spawn_runtime  # noqa: E402
from proc_cpu import GC_THREADS, JIT_THREADS, cmdline, proc_stat  # noqa: E402

from spark_runtime.session import DEFAULT_CONF  # noqa: E402

PARTITIONS = 2
RUNTIME_DEFAULT = DEFAULT_CONF["spark.driver.extraJavaOptions"]
DEFAULT_SETS = ";-Xss32m -XX:CompileThresholdScaling=5;-Xss32m -XX:TieredStopAtLevel=1"
"""The runtime's default (HotSpot's JIT settings), later JIT compilation, and C1 only."""
CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
JIT = "JIT compilers (C1, C2)"
THREAD_GROUPS = [
    (JIT, JIT_THREADS),
    ("GC", GC_THREADS),
    ("Spark tasks", ("Executor task",)),
    ("stream execution", ("stream executio",)),  # thread names are cut to 15 characters
]
"""JVM threads by name prefix; the rest (the main thread, py4j's call threads, RPC, ...) is 'other JVM'."""
PYTHON_GROUPS = [
    ("Python: the runtime (driver)", "spark_runtime"),
    ("Python: data source runners", "python_streaming_source_runner"),
    ("Python: worker daemons and workers", "pyspark.daemon"),
]
LABELS = [g for g, _ in THREAD_GROUPS] + ["other JVM"] + [g for g, _ in PYTHON_GROUPS] + ["Python: other"]
NOTES = [
    "CPU seconds are user + system time from /proc (each JVM thread, each Python process), sampled every 0.25 s until "
    "the child's commits/0 exists (a Python process that exits between samples loses up to 0.25 s). Unlike wall "
    "time, they do not depend on CPU stolen by the hypervisor.",
    "-XX:CompileThresholdScaling=5 compiles a method after 5x as many calls (start-up code stays interpreted, hot "
    "code still reaches C2); -XX:TieredStopAtLevel=1 (C1 only) removes C2's work but leaves hot code slower for the "
    "shard's life. Neither is a default: with CompileThresholdScaling=5 the throughput benchmark (section 1) was not "
    "faster (builtin count 0.81x instead of 0.87x in one run); C1 only was not measured there. A Task's "
    "spec.spark.conf['spark.driver.extraJavaOptions'] replaces the runtime's default; keep -Xss32m.",
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


def group_of(name: str, groups: list[tuple[str, Any]], fallback: str, match: Any) -> str:
    return next((label for label, key in groups if match(name, key)), fallback)


def sample(pids: list[int], threads: dict[tuple[int, str], float], processes: dict[tuple[int, str], float]) -> None:
    """The CPU seconds of every JVM thread (into ``threads``) and every other process (into ``processes``)."""
    for pid in pids:
        st = proc_stat(f"/proc/{pid}/stat")
        if st is None:
            continue
        if st[0] != "java":
            processes[(pid, cmdline(pid))] = st[1]
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            ts = proc_stat(f"/proc/{pid}/task/{tid}/stat")
            if ts is not None:
                threads[(int(tid), ts[0])] = ts[1]


def run_child(root: Path, manifest: str, java_options: str, index: int) -> dict[str, Any]:
    """One fresh child process: start -> ``commits/0``; its CPU by group."""
    shard = f"child-{index}"
    conf = CONF | ({"spark.driver.extraJavaOptions": java_options} if java_options else {})
    cfg = restore_cost.config(root, shard, 64, PARTITIONS, conf, {"parent": restore_cost.PARENT, "manifest": manifest})
    restore_cost.cleanup_child(root, shard)
    cfg_path = root / f"{shard}.json"
    cfg_path.write_text(json.dumps(cfg.to_json_dict()))
    commit0 = root / "state" / restore_cost.TASK / "shards" / shard / "checkpoint" / "commits" / "0"
    t0 = time.time()
    proc = spawn_runtime(cfg_path, root / f"{shard}.log")
    threads: dict[tuple[int, str], float] = {}
    processes: dict[tuple[int, str], float] = {}
    try:
        deadline = time.monotonic() + 600
        while not commit0.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"child {shard} exited with {proc.returncode}; see {root / shard}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"child {shard} did not commit batch 0 in 600 s")
            sample([proc.pid, *descendants(proc.pid)], threads, processes)
            time.sleep(0.25)
        sample([proc.pid, *descendants(proc.pid)], threads, processes)
        wall = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this script started; nothing to drain
        proc.wait(timeout=60)
    groups: dict[str, float] = {}
    for (_, name), cpu in threads.items():
        label = group_of(re.sub(r"[-#\d\s]+$", "", name), THREAD_GROUPS, "other JVM", str.startswith)
        groups[label] = groups.get(label, 0.0) + cpu
    for (_, cmd), cpu in processes.items():
        label = group_of(cmd, PYTHON_GROUPS, "Python: other", lambda c, needle: needle in c)
        groups[label] = groups.get(label, 0.0) + cpu
    return {
        "wall": round(wall, 2),
        "jvm": round(sum(threads.values()), 2),
        "python": round(sum(processes.values()), 2),
        "pythonProcesses": sum(1 for (_, cmd) in processes if cmd.strip()),
        "groups": {k: round(v, 2) for k, v in groups.items()},
    }


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.7 * len(rows)))
    for i, r in enumerate(rows):
        left = 0.0
        for j, label in enumerate(LABELS):
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


def medians(opts: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One option set's row: the medians of its children."""
    row = {k: statistics.median(r[k] for r in rs) for k in ("wall", "jvm", "python", "pythonProcesses")}
    row["groups"] = {g: round(statistics.median(r["groups"].get(g, 0.0) for r in rs), 2) for g in LABELS}
    return {"label": opts or f"runtime default: {RUNTIME_DEFAULT}", **row}


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=None)
    ap.add_argument("--keys", type=int, default=50_000, help="distinct keys of the parent's state (default 50,000)")
    ap.add_argument("--repeat", type=int, default=2, help="children per JVM option set (default 2)")
    sets = f"';'-separated spark.driver.extraJavaOptions sets ('': the runtime's default; default {DEFAULT_SETS!r})"
    ap.add_argument("--java-options", default=DEFAULT_SETS, help=sets)
    args = parse(ap, argv)
    root = args.out / "work" / "child_cpu" / f"keys-{args.keys}"
    runs: dict[str, list[dict[str, Any]]] = {}
    with LoadSampler() as load:
        say(f"parent state of {args.keys:,} keys in {root}")
        manifest = build_parent(root, args.keys)
        index = 0
        for _ in range(args.repeat):
            for opts in (o.strip() for o in args.java_options.split(";")):  # interleaved: load hits every set alike
                index += 1
                r = run_child(root, manifest, opts, index)
                say(f"'{opts or 'default'}': wall {r['wall']:.1f} s, CPU s JVM {r['jvm']:.1f} Python {r['python']:.1f}")
                runs.setdefault(opts, []).append(r)
    rows = [medians(opts, rs) for opts, rs in runs.items()]
    title = f"A fresh split child restoring half of a {args.keys:,}-key state (builtin count, local[2]): CPU seconds "
    title += f"from process start to the first committed batch, median of {args.repeat}"
    columns = ["JVM options", "wall s", "CPU s", "JVM", *LABELS, "Python processes"]
    table = [
        [r["label"], r["wall"], round(r["jvm"] + r["python"], 2), r["jvm"], *(r["groups"][g] for g in LABELS)]
        + [r["pythonProcesses"]]
        for r in rows
    ]
    plot(rows, args.out / "child_cpu.png", title)
    publish(
        "child_cpu",
        args,
        argv,
        title="Where a split child's CPU goes (informational)",
        load=load.summary(),
        tables=[(title, columns, table)],
        targets=[],
        plots=["child_cpu.png"],
        notes=NOTES,
        raw={"runs": runs},
    )
    return 0


def summarize(data: dict[str, Any]) -> list[str]:
    """Per JVM option set: the child's CPU seconds to its first batch (JVM, JIT, Python) and wall time."""
    out = []
    for opts, runs in data["raw"]["runs"].items():
        jvm, python = (statistics.median(r[k] for r in runs) for k in ("jvm", "python"))
        jit = statistics.median(r["groups"].get(JIT, 0.0) for r in runs)
        procs = statistics.median(r["pythonProcesses"] for r in runs)
        out.append(
            f"JVM options '{opts or 'default'}': {jvm + python:.1f} CPU s from the child's start to its first batch "
            f"({jvm:.1f} in the JVM, {jit:.1f} of it in the JIT compilers; {python:.1f} in {procs:.0f} Python "
            f"processes); wall {statistics.median(r['wall'] for r in runs):.1f} s."
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
