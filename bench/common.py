"""Shared helpers of the benchmark scripts: machine facts, load sampling, tables, JSON results, plots, /proc.

Every script under ``bench/`` (except ``shard_throughput.py``, which has its own format) writes one result file
``<out>/<name>.json`` with this shape, which ``bench/run_all.py`` turns into ``docs/benchmarks.md``::

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

import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / ".run" / "bench"
VENV_BIN = str(Path(sys.executable).parent)

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


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
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


# ---------------------------------------------------------------- the local control plane


def kubectl_retry(cluster: Any, *args: str, input: str | None = None, namespace: str | None = None) -> str:
    """``cluster.kubectl(...)``, retried for up to a minute: right after the CRDs are Established the API server
    may still answer 429 "storage is (re)initializing" for them. Raises with kubectl's stderr."""
    deadline = time.monotonic() + 60
    while True:
        result = cluster.kubectl(*args, input=input, namespace=namespace, check=False)
        if result.returncode == 0:
            return result.stdout
        if time.monotonic() > deadline:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        time.sleep(1.0)


def wait_served(cluster: Any, namespace: str, *plurals: str) -> None:
    """Wait until the API server lists each resource in ``namespace`` (the CRDs are served, not just Established)."""
    for plural in plurals:
        kubectl_retry(cluster, "get", plural, namespace=namespace)


# ---------------------------------------------------------------- files and processes


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def birth_time(path: Path) -> float | None:
    """The creation time of ``path`` (statx btime via ``stat -c %.9W``), None where the filesystem has none."""
    try:
        out = subprocess.run(["stat", "-c", "%.9W", str(path)], capture_output=True, text=True, timeout=10)
        value = float(out.stdout.strip())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return value if value > 0 else None


def _ppid_map() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        out[int(d)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a snapshot)."""
    children: dict[int, list[int]] = {}
    for p, pp in _ppid_map().items():
        children.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
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
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / tick


def status_kib(pid: int, field: str) -> int | None:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``), None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
