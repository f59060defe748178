"""The benchmark harness: options, machine facts, load sampling, tables, Targets rows, result files, plots, /proc.

A benchmark is a script under ``bench/`` with ``main(argv)`` and ``summarize(data)``: ``main`` takes
:func:`options` (``--out``, ``--seed``) and its own flags, measures, and writes one result file
``<out>/<name>.json`` through :func:`publish`; ``summarize`` turns that file back into the "What the numbers say"
lines of its section. ``bench/run_all.py`` only orders the scripts and renders ``docs/benchmarks.md``; a
benchmark on a cluster starts it with ``hack/operator_bed.py`` (the bootstrap ``make demo`` uses). The shape::

    {
      "benchmark": "split_latency", "title": "...", "command": "python bench/split_latency.py ...",
      "parameters": {...}, "machine": {...},
      "load": {"before": [1m, 5m, 15m], "after": [...], "during": {"min": .., "mean": .., "max": .., "samples": n}},
      "tables": [{"title": "...", "columns": [...], "rows": [[...], ...]}],
      "targets": [{"name": "...", "target": "<= 20 s", "value": "31.2 s", "met": false, "why": "..."}],
      "plots": ["split_latency.png"],           # file names, next to the JSON
      "notes": ["how each number was measured", ...],
      "raw": {...}                              # everything measured, for re-analysis
    }

Numbers on a shared 2-core machine are noisy: scripts sample the load average while they measure and report it
next to each table, and prefer ratios measured inside one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / ".run" / "bench"

for _p in (REPO, REPO / "operator", REPO / "hack"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))


# ---------------------------------------------------------------- machine and load


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_times() -> list[int]:
    """The machine's aggregate CPU times from ``/proc/stat`` (user nice system idle iowait irq softirq steal ...)."""
    with open("/proc/stat", encoding="ascii") as fh:
        return [int(x) for x in fh.readline().split()[1:]]


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "unavailable"


def proc_value(path: str, field: str) -> str | None:
    """The value of the first ``<field>: <value>`` line of a ``/proc`` file (None without one, or without the file)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == field), None)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = proc_value("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
    mem = proc_value("/proc/meminfo", "MemTotal")
    mem_gib = round(int(mem.split()[0]) / 1024 / 1024, 1) if mem else None
    try:
        import pyspark

        spark_version = pyspark.__version__
    except ImportError:  # pragma: no cover - the venv has it
        spark_version = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory GiB": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "java": _first_line(["java", "-version"]),
        "pyspark": spark_version,
        "commit": _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


class LoadSampler:
    """Samples the 1-minute load average every ``interval`` seconds in a daemon thread (``with`` block)."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.before: list[float] = []
        self.after: list[float] = []
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self.before = loadavg()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.after = loadavg()

    def summary(self) -> dict[str, Any]:
        s = self.samples or [self.before[0] if self.before else 0.0]
        return {
            "before": self.before,
            "after": self.after or loadavg(),
            "during": {
                "min": round(min(s), 2),
                "mean": round(sum(s) / len(s), 2),
                "max": round(max(s), 2),
                "samples": len(self.samples),
            },
        }


def load_text(load: dict[str, Any]) -> str:
    d = load["during"]
    return (
        f"load average (1 min) during the run: min {d['min']:.2f}, mean {d['mean']:.2f}, max {d['max']:.2f} "
        f"on {os.cpu_count()} cores; before {load['before'][0]:.2f}/{load['before'][1]:.2f}/{load['before'][2]:.2f}, "
        f"after {load['after'][0]:.2f}/{load['after'][1]:.2f}/{load['after'][2]:.2f} (1/5/15 min)"
    )


# ---------------------------------------------------------------- tables and results


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def median(values: list[Any]) -> float | None:
    """The median of the values that were measured (None when none was), 3 decimals."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` (3 decimals), None when either is missing or ``b`` is 0."""
    return round(a / b, 3) if a is not None and b else None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, ``{}`` when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def md_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table; columns whose values are all numbers (or empty) are right-aligned."""

    def numeric(i: int) -> bool:
        return all(r[i] is None or (isinstance(r[i], int | float) and not isinstance(r[i], bool)) for r in rows)

    head = "| " + " | ".join(columns) + " |\n"
    sep = "|" + "|".join("---:" if rows and numeric(i) else "---" for i in range(len(columns))) + "|\n"
    body = "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in rows)
    return head + sep + body


def print_table(title: str, columns: list[str], rows: list[list[Any]], load: dict[str, Any] | None = None) -> None:
    print(f"\n{title}", flush=True)
    if load:
        print(load_text(load), flush=True)
    print(md_table(columns, rows), flush=True)


def command_line(argv: list[str] | None) -> str:
    """The exact command that reproduces this run (relative to the repository root)."""
    script = os.path.relpath(sys.argv[0], REPO) if sys.argv and sys.argv[0] else "bench/?.py"
    args = sys.argv[1:] if argv is None else argv
    return " ".join([".venv/bin/python", shlex.quote(script), *(shlex.quote(a) for a in args)])


def write_result(out: Path, name: str, payload: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, **payload}, indent=2, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- files and processes


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def stat_fields(path: str) -> tuple[str, list[str]] | None:
    """``(comm, the fields after it)`` of a ``/proc/.../stat`` file (None when it is gone)."""
    try:
        raw = Path(path).read_text()
    except OSError:
        return None
    return raw[raw.index("(") + 1 : raw.rindex(")")], raw[raw.rindex(")") + 2 :].split()


def children_map() -> dict[int, list[int]]:
    """Parent pid -> the pids of its children, from ``/proc`` (a snapshot)."""
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := stat_fields(f"/proc/{d}/stat")) is not None:
            out.setdefault(int(st[1][1]), []).append(int(d))
    return out


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and every process below it in ``children`` (default: a fresh :func:`children_map`)."""
    children = children_map() if children is None else children
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], []))
    return out


def spawn_runtime(config_path: Path, log_path: Path) -> subprocess.Popen:
    """``python -m spark_runtime run --config <config_path>`` in its own session (so the caller can stop its
    whole process group), output into ``log_path``, Spark's Python workers on this interpreter."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "spark_runtime", "run", "--config", str(config_path)],
            cwd=REPO,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the live processes ``pids`` (plus their reaped children)."""
    stats = [st[1] for p in pids if (st := stat_fields(f"/proc/{p}/stat")) is not None]
    return sum(int(f[11]) + int(f[12]) + int(f[13]) + int(f[14]) for f in stats) / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, field: str) -> int | None:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``), None when the process is gone."""
    value = proc_value(f"/proc/{pid}/status", field)
    return int(value.split()[0]) if value else None


# ---------------------------------------------------------------- the harness: options, targets, the result file


def options(doc: str | None, *, seed: int | None = 7) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--out`` (the results directory) and, unless ``seed`` is None,
    ``--seed``. The description is the first paragraph of ``doc`` (the script's docstring)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    if seed is not None:
        ap.add_argument("--seed", type=int, default=seed, help=f"random seed (default {seed})")
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``ap.parse_args(argv)`` with ``--out`` made absolute (paths go into configs and hostPath volumes), created."""
    args = ap.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def target(name: str, bound: str, value: str, met: bool, why: str | None = None) -> dict[str, Any]:
    """One Targets row: what is measured, the target (``"<= 5 s"``, ``"exact"``, ``"reported"``), the measured
    value as text, whether it is met, and (when missed) what the time or memory is spent on."""
    row: dict[str, Any] = {"name": name, "target": bound, "value": value, "met": bool(met)}
    if why and not met:
        row["why"] = why
    return row


def bed_task(name: str, namespace: str, data: Path, partitions: int, spark: dict[str, Any], **spec: Any) -> dict:
    """A Task for ``hack/operator_bed.py``: one shard of 128 key groups, builtin count keyed by ``key``, its journal
    (``partitions``), output and state under ``data`` (the pods' ``/data``), the shard image with ``spark``;
    ``spec`` adds or replaces fields."""
    spec = {"maxKeyGroups": 128, "initialShards": 1, "keyField": "key", "processor": {"builtin": "count"}} | spec
    spec["source"] = {"journal": {"path": f"/data/journal/{name}", "partitions": partitions}}
    spec["sink"] = {"directory": {"path": f"/data/output/{name}", "format": "jsonl"}}
    spec["storage"] = {"path": "/data/state", "volume": {"hostPath": str(data), "mountPath": "/data"}}
    spec["spark"] = {"image": "taskshard/shard:0.1.0", **spark}
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": "taskshard.io/v1alpha1", "kind": "Task", "metadata": meta, "spec": spec}


def publish(
    name: str,
    args: argparse.Namespace,
    argv: list[str] | None,
    *,
    title: str,
    load: dict[str, Any],
    tables: list[tuple[str, list[str], list[list[Any]]]],
    targets: list[dict[str, Any]],
    plots: list[str] = (),  # type: ignore[assignment]
    notes: list[str] = (),  # type: ignore[assignment]
    raw: Any = None,
) -> Path:
    """Print each ``(title, columns, rows)`` table and write ``<args.out>/<name>.json`` in the shape this module's
    docstring gives (the parameters are ``args``; the command line is ``argv``'s)."""
    for table_title, columns, rows in tables:
        print_table(table_title, columns, rows, load)
    payload = {
        "title": title,
        "command": command_line(argv),
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine(),
        "load": load,
        "tables": [{"title": t, "columns": c, "rows": r} for t, c, r in tables],
        "targets": list(targets),
        "plots": list(plots),
        "notes": list(notes),
        "raw": raw,
    }
    return write_result(args.out, name, payload)


def bar_plot(path: Path, bars: dict[str, float], *, xlabel: str, title: str) -> None:
    """A horizontal bar per entry of ``bars`` (label -> value), saved as ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.45 * max(2, len(bars))))
    ax.barh(list(bars), list(bars.values()), color="#4c72b0")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- in-process shard runs


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system, with reaped children's) used so far by this process tree: the driver, the JVM,
    Spark's Python workers. Unlike wall time it barely moves when other jobs share the machine."""
    return cpu_seconds(descendants(os.getpid()))


def cpu_since(start: float) -> float:
    """CPU seconds of the process tree since ``start``; NaN when the tree lost a process that was not yet
    reaped (its time then shows up nowhere: the sample is dropped rather than reported wrong)."""
    time.sleep(0.5)  # let parents reap finished workers so their time moves into cutime
    used = tree_cpu_seconds() - start
    return used if used > 0 else float("nan")


def rounds(repeat: int, journal: Path, warm: Path, batches: int, partitions: int) -> Iterator[tuple[bool, Path, int]]:
    """Round 0 warms up on ``warm`` (2 micro-batches), rounds 1.. are measured on ``journal``: (measured, journal,
    byte budget per trigger: split evenly over the partitions, the largest one takes ``batches`` micro-batches)."""
    for attempt in range(repeat + 1):
        src = journal if attempt else warm
        largest = max(f.stat().st_size for f in src.glob("p*.jsonl"))
        yield attempt > 0, src, (-(-largest // (batches if attempt else 2)) + 256) * partitions


def runner_config(
    root: Path, journal: Path, parts: int, shard: str, start: int, end: int, proc: dict, conf: dict, **extra: Any
) -> Any:
    """A shard's parsed config: task ``bench`` (``task=`` another), 128 key groups, ``proc``, a journal of
    ``parts`` partitions, sink and storage under ``root``, local[2] with ``conf``, a 1 s trigger (``trigger=``
    another); ``extra`` adds or replaces top-level fields (``restoreFrom``, ``metricsPort``, ``source``, ...)."""
    from spark_runtime.config import parse_config

    trigger = extra.pop("trigger", "1 second")
    cfg = {"task": "bench", "shard": shard, "maxKeyGroups": 128, "keyGroups": {"start": start, "end": end}}
    cfg |= {"processor": proc, "source": {"journal": {"path": str(journal), "partitions": parts}}}
    cfg["sink"] = {"directory": {"path": str(root / "out"), "format": "jsonl"}}
    cfg["storage"] = {"path": str(root / "state")}
    cfg["spark"] = {"master": "local[2]", "conf": conf, "triggerInterval": trigger}
    return parse_config(cfg | extra)


def timed_query(start: Callable[[], Any]) -> tuple[float, float, list[dict[str, Any]]]:
    """``start()`` an availableNow query, wait for it: its wall and CPU (process tree) seconds, its progress."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    query = start()
    query.awaitTermination()
    seconds, cpu = time.perf_counter() - t0, cpu_since(c0)
    return seconds, cpu, [json.loads(p.json) for p in query.recentProgress]


def method_notes(doc: str) -> list[str]:
    """The "How it is measured" notes of a result: the paragraphs of the script's docstring between its first
    paragraph and its usage line, each on one line."""
    paragraphs = doc.strip().split("\n\n")[1:]
    return [" ".join(p.split()) for p in paragraphs if not p.lstrip().startswith(".venv/")]
