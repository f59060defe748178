"""Executors on Kubernetes against local mode: one shard's throughput and CPU per event, with Spark executor pods
and with Spark's local mode inside its driver pod.

A script, not a test. It starts the local control plane **with** the node agent (shard pods really run, as local
processes with their own JVMs), installs the CRDs, applies the driver's RBAC (``docs/examples/spark-driver-rbac.yaml``)
in its namespace and runs the operator (``python -m taskshard_operator``, production defaults). The input is the
scaling benchmark's (``bench/scaling.py``'s ``write_input``: ``--events`` events over ``--keys`` keys in 4 journal
partitions, each key in partition ``crc32(key) % 4``), generated once with ``--seed``, so every run reads the same
bytes. For each mode in ``--modes``, interleaved ``--repeat`` times, a fresh Task (the previous one deleted and its
pods gone first) with one shard over 128 key groups, builtin count, a journal source with 4 partitions and hostPath
storage under the run directory:

- ``local``: the default, Spark's local mode in the driver pod (``local[2]``: two task threads in its JVM);
- ``executors``: ``spec.spark.executors.instances: --executors`` (default 2, one core each: as many task slots as
  ``local[2]``), ``resources.limits.memory: --executor-memory`` and ``spec.spark.serviceAccountName:
  taskshard-spark``; the driver pod ``<shard>-driver`` starts the executor pods ``<shard>-exec-<n>``.

Each run warms up first: a small input (``--warmup-events``) is in the journal when the Task is applied, and the
shard's per-key results (``spark_runtime.results.final_results``) must equal a plain-Python count of it; with
executors, all of them must be running, too. After ``--settle`` idle seconds (the pods' idle CPU is measured), the
timed input is appended (one ``write`` per partition file) and the clock runs until the shard has committed a batch
whose end positions (``checkpoint/offsets/<N>``) are the journal's ends: the time is that batch's commit
(``checkpoint/commits/<N>`` mtime). Then the per-key results must equal the plain-Python count of the warm-up plus
the timed input: a run whose results are not exact fails the benchmark (exit code 1, after writing the results).

CPU: user + system seconds, over the timed window, of every process of the shard's pods: the driver's process tree
and each executor pod's process tree (JVM, Python runtime and Spark's Python workers; ``proc_cpu.TreeCpu``, sampled
every second and at both ends of the window), each found through its container id (the node agent's container id
is the process id of the container's process group: ``local://<pid>``). The pods are listed every second while the
window runs, so an executor that Spark starts in the window (a replacement) is counted from its start. Also
measured: the tasks each executor finished in the window (``Executor: Finished task`` lines of its log), the
machine's busy and stolen CPU time (``/proc/stat``) and the load average.

On a 2-core machine the executors compete with the driver for the same two cores: this shows what executors cost
(more JVMs, tasks and shuffle blocks shipped between processes), not a speed-up.

Prints the tables and writes ``<out>/executors.{json,png}``.

    .venv/bin/python bench/executors.py --repeat 3
    .venv/bin/python bench/executors.py --events 50000 --repeat 1        # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    REPO,
    VENV_BIN,
    LoadSampler,
    command_line,
    kubectl_retry,
    machine,
    mtime,
    print_table,
    pyplot,
    say,
    wait_served,
    write_result,
)
from proc_cpu import CPU_KINDS, MachineCpu, TreeCpu, machine_between  # noqa: E402

NAME = "executors"
NAMESPACE = "bench-executors"
MAX_KEY_GROUPS = 128
PARTITIONS = 4
GROUP, VERSION = "taskshard.io", "v1alpha1"
RBAC = REPO / "docs" / "examples" / "spark-driver-rbac.yaml"
SERVICE_ACCOUNT = "taskshard-spark"
LABEL_TASK, LABEL_SHARD, LABEL_COMPONENT = "taskshard.io/task", "taskshard.io/shard", "taskshard.io/component"
MODES = {"local": "local mode (local[2] in the driver pod)", "executors": "executors on Kubernetes"}
"""``--modes`` values and their labels in the tables."""
FINISHED_TASK = "Executor: Finished task"
"""What an executor's log says for each task it finished."""


# ---------------------------------------------------------------- pure helpers


def median(values: list[Any]) -> float | None:
    """The median of the values that were measured (None when none was)."""
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` (3 decimals), None when either is missing or ``b`` is 0."""
    return round(a / b, 3) if a is not None and b else None


def container_pid(pod: dict[str, Any]) -> int | None:
    """The process id of a running pod's container (the node agent's container id ``local://<pid>``)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        cid = cs.get("containerID") or ""
        if "running" in (cs.get("state") or {}) and "://" in cid:
            tail = cid.split("://", 1)[1]
            if tail.isdigit():
                return int(tail)
    return None


def is_executor(pod: dict[str, Any]) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT) == "executor"


def task_manifest(task: str, mode: str, args: argparse.Namespace, conf: dict[str, str]) -> dict[str, Any]:
    """The Task of one run: one shard over 128 key groups, builtin count, the journal under ``/data``; the
    ``executors`` mode adds the executors and the driver's service account, nothing else differs."""
    spark: dict[str, Any] = {
        "image": "taskshard/shard:0.1.0",
        "conf": dict(conf),
        "triggerInterval": args.trigger,
    }
    if mode == "executors":
        spark["serviceAccountName"] = SERVICE_ACCOUNT
        spark["executors"] = {"instances": args.executors, "resources": {"limits": {"memory": args.executor_memory}}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Task",
        "metadata": {"name": task, "namespace": NAMESPACE},
        "spec": {
            "maxKeyGroups": MAX_KEY_GROUPS,
            "initialShards": 1,
            "keyField": "key",
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": f"/data/journal/{task}", "partitions": PARTITIONS}},
            "sink": {"directory": {"path": f"/data/output/{task}", "format": "jsonl"}},
            "storage": {"path": "/data/state", "volume": {"hostPath": str(args.data), "mountPath": "/data"}},
            "spark": spark,
        },
    }


def compare_counts(found: dict[str, Any], expected: Counter | dict[str, int]) -> dict[str, Any]:
    """How the shard's per-key results differ from the plain-Python count."""
    got = {str(k): int(v) for k, v in found.items()}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    return {
        "exact": not (missing or extra or wrong),
        "keys": len(got),
        "expectedKeys": len(expected),
        "eventsCounted": sum(got.values()),
        "eventsExpected": sum(expected.values()),
        "missingKeys": len(missing),
        "extraKeys": len(extra),
        "wrongKeys": len(wrong),
        "examples": {k: [got.get(k), expected.get(k)] for k in (missing + extra + wrong)[:5]},
    }


def summarize(results: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Medians per mode over the repeats, and executors / local: the ratio of the medians (the headline) and the
    ratio of each repeat's pair (the two modes ran one after the other)."""
    per_mode: dict[str, dict[str, Any]] = {}
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode]
        per_mode[mode] = {
            "runs": len(rows),
            "seconds": median([r["seconds"] for r in rows]),
            "eventsPerSecond": median([r["eventsPerSecond"] for r in rows]),
            "cpuSeconds": median([r["cpuSeconds"] for r in rows]),
            "cpuMicrosPerEvent": median([r["cpuMicrosPerEvent"] for r in rows]),
            "executorShare": median([r.get("executorShare") for r in rows]),
            "idleCores": median([r.get("idleCores") for r in rows]),
            "cpuKinds": {k: median([r["cpuKinds"].get(k) for r in rows]) for k in CPU_KINDS},
            "stealPercent": median([r.get("stealPercent") for r in rows]),
            "exact": all(r["exact"] for r in rows) if rows else None,
        }
    local, execs = per_mode.get("local") or {}, per_mode.get("executors") or {}
    paired = []
    for rep in sorted({r["repeat"] for r in results}):
        pair = {r["mode"]: r for r in results if r["repeat"] == rep}
        if "local" in pair and "executors" in pair:
            paired.append(
                {
                    "repeat": rep,
                    "eventsPerSecond": ratio(pair["executors"]["eventsPerSecond"], pair["local"]["eventsPerSecond"]),
                    "cpuPerEvent": ratio(pair["executors"]["cpuMicrosPerEvent"], pair["local"]["cpuMicrosPerEvent"]),
                }
            )
    return {
        "modes": per_mode,
        "ratios": {
            "eventsPerSecond": ratio(execs.get("eventsPerSecond"), local.get("eventsPerSecond")),
            "cpuPerEvent": ratio(execs.get("cpuMicrosPerEvent"), local.get("cpuMicrosPerEvent")),
            "cpuSeconds": ratio(execs.get("cpuSeconds"), local.get("cpuSeconds")),
            "paired": paired,
        },
    }


RUN_COLUMNS = [
    "repeat",
    "mode",
    "executor pods",
    "append -> caught up s",
    "events/s",
    "batches",
    "CPU s (the shard's pods)",
    "driver CPU s",
    "executors CPU s",
    "executors' share of the CPU %",
    "CPU µs / event",
    "tasks finished on executors",
    "idle CPU before (cores)",
    "machine busy CPU s",
    "CPU steal %",
    "load (1 min) at the append",
    "results exact",
]


def run_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per run (``RUN_COLUMNS``)."""
    return [
        [
            r["repeat"],
            MODES[r["mode"]],
            len(r["executorPods"]) if r["mode"] == "executors" else None,
            r["seconds"],
            r["eventsPerSecond"],
            r["batches"],
            r["cpuSeconds"],
            r["driverCpuSeconds"],
            r["executorCpuSeconds"] if r["mode"] == "executors" else None,
            round(100 * r["executorShare"], 1) if r.get("executorShare") is not None else None,
            r["cpuMicrosPerEvent"],
            sum(r["executorTasks"].values()) if r["mode"] == "executors" else None,
            r["idleCores"],
            r["machine"]["busy"],
            r["stealPercent"],
            r["load1"],
            r["exact"],
        ]
        for r in results
    ]


SUMMARY_COLUMNS = [
    "mode",
    "runs",
    "append -> caught up s (median)",
    "events/s (median)",
    "CPU s (median)",
    "CPU µs / event (median)",
    "executors' share of the CPU % (median)",
    "CPU steal % (median)",
    "results exact",
]


def summary_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """One row per mode and, with both modes, the ratio executors / local of the medians (``SUMMARY_COLUMNS``)."""
    rows: list[list[Any]] = []
    for mode, m in summary["modes"].items():
        share = m.get("executorShare")
        rows.append(
            [
                MODES[mode],
                m["runs"],
                m["seconds"],
                m["eventsPerSecond"],
                m["cpuSeconds"],
                m["cpuMicrosPerEvent"],
                round(100 * share, 1) if share is not None else None,
                m["stealPercent"],
                m["exact"],
            ]
        )
    modes = summary["modes"]
    if "local" in modes and "executors" in modes:
        r = summary["ratios"]
        rows.append(
            [
                "executors / local (ratio of the medians)",
                None,
                ratio(modes["executors"]["seconds"], modes["local"]["seconds"]),
                r["eventsPerSecond"],
                r["cpuSeconds"],
                r["cpuPerEvent"],
                None,
                None,
                None,
            ]
        )
    return rows


KIND_COLUMNS = ["repeat", "mode", "pods", *[f"{k} s" for k in CPU_KINDS], "total CPU s"]


def kind_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """Where each run's CPU went, by pod group (the driver, the executors) and kind (``KIND_COLUMNS``)."""
    rows = []
    for r in results:
        for group, kinds in r["cpuKindsByGroup"].items():
            rows.append([r["repeat"], MODES[r["mode"]], group, *[kinds.get(k) for k in CPU_KINDS], sum(kinds.values())])
    return rows


PAIR_COLUMNS = ["repeat", "events/s: executors / local", "CPU per event: executors / local"]


def pair_rows(summary: dict[str, Any]) -> list[list[Any]]:
    return [[p["repeat"], p["eventsPerSecond"], p["cpuPerEvent"]] for p in summary["ratios"]["paired"]]


def targets(results: list[dict[str, Any]], summary: dict[str, Any], executors: int) -> list[dict[str, Any]]:
    """The Targets rows: exact results with executors (target), and the two ratios against local mode (reported:
    met when measured)."""
    runs = [r for r in results if r["mode"] == "executors"]
    exact = [r for r in runs if r["exact"]]
    modes = summary["modes"]
    local, execs = modes.get("local") or {}, modes.get("executors") or {}
    ratios = summary["ratios"]
    eps, cpu = ratios.get("eventsPerSecond"), ratios.get("cpuPerEvent")
    events = runs[0]["events"] if runs else None
    wrong = [
        f"repeat {r['repeat']}: {r['check']['wrongKeys']} keys wrong, {r['check']['missingKeys']} missing, "
        f"{r['check']['extraKeys']} unexpected ({r['check']['eventsCounted']:,} of {r['check']['eventsExpected']:,} "
        "events counted)"
        for r in runs
        if not r["exact"]
    ]
    exact_row: dict[str, Any] = {
        "name": f"{executors} executors: results exact",
        "target": "exact",
        "value": (
            f"exact in {len(exact)} of {len(runs)} runs ({events:,} events, plain-Python count)"
            if runs
            else "not measured"
        ),
        "met": bool(runs) and len(exact) == len(runs),
    }
    if wrong:
        exact_row["why"] = "Per-key results against the plain-Python count: " + "; ".join(wrong)
    return [
        exact_row,
        {
            "name": f"{executors} executors: events/s vs local mode (ratio; reported)",
            "target": "reported",
            "value": (
                f"{eps:.2f}x ({execs['eventsPerSecond']:,.0f} vs {local['eventsPerSecond']:,.0f} events/s, medians)"
                if eps is not None
                else "not measured"
            ),
            "met": eps is not None,
        },
        {
            "name": f"{executors} executors: CPU per event vs local mode (ratio; reported)",
            "target": "reported",
            "value": (
                f"{cpu:.2f}x ({execs['cpuMicrosPerEvent']:.1f} vs {local['cpuMicrosPerEvent']:.1f} CPU µs / event, "
                "medians)"
                if cpu is not None
                else "not measured"
            ),
            "met": cpu is not None,
        },
    ]


# ---------------------------------------------------------------- CPU of the shard's pods


class PodTreeCpu(TreeCpu):
    """:class:`proc_cpu.TreeCpu` over the process trees of a shard's pods, to which a root can be added while it
    runs (an executor pod started in the window counts from its start). A root is a container's process, reaped by
    the node agent (not measured): it counts by its own sampled times, also after it exits."""

    def __init__(self, roots: dict[str, int], interval: float = 1.0) -> None:
        super().__init__({}, interval=interval)
        for label, pid in roots.items():
            self.add(label, pid)

    def add(self, label: str, pid: int) -> bool:
        """Measure the tree of ``pid`` as ``label`` from now on; False when ``label`` is measured already."""
        with self.lock:
            if label in self.roots:
                return False
            self.roots[label] = pid
            self.last[label] = {}
            self.unaccounted[pid] = True
        self._sample()
        return True


# ---------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from localkube.binaries import ensure_binaries

        self.args = args
        self.run_dir = (args.out / "work" / NAME / time.strftime("%Y%m%d-%H%M%S")).resolve()
        self.data = self.run_dir / "data"
        args.data = self.data
        self.binaries = ensure_binaries()
        self.cluster: Any = None
        self.operator: subprocess.Popen | None = None
        self.api: Any = None
        self.core: Any = None
        self.task: str | None = None

    # ------------------------------------------------------------ plumbing
    def shard_dir(self, task: str, shard: str) -> Path:
        return self.data / "state" / task / "shards" / shard

    def check_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is not None:
            log = (self.run_dir / "operator.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the operator exited with {self.operator.returncode}:\n{log}")

    def wait(self, what: str, probe: Any, timeout: float, interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = probe()
            if value:
                return value
            self.check_operator()
            time.sleep(interval)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (run dir {self.run_dir})")

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return [self.api.sanitize_for_serialization(p) for p in items]

    def shard_pods(self, shard: str) -> list[dict[str, Any]]:
        """The shard's driver pod and executor pods (not being deleted)."""
        return [
            p
            for p in self.pods(f"{LABEL_SHARD}={shard},{LABEL_COMPONENT} in (shard,executor)")
            if not p["metadata"].get("deletionTimestamp")
        ]

    def results(self, task: str) -> dict[str, Any]:
        from spark_runtime.results import final_results

        try:
            return final_results(self.data / "output" / task, self.data / "state", task)
        except (OSError, ValueError, KeyError):
            return {}

    def executor_tasks(self, pods: list[str]) -> dict[str, int]:
        """Tasks each executor pod has finished so far (its log's ``Executor: Finished task`` lines)."""
        out = {}
        for pod in pods:
            path = self.cluster.pod_log_path(NAMESPACE, pod, "executor")
            text = path.read_text(errors="replace") if path.exists() else ""
            out[pod] = text.count(FINISHED_TASK)
        return out

    def committed(self, task: str, shard: str) -> tuple[int, dict[str, int] | None]:
        """The shard's last committed batch and its journal end positions (None before its first commit)."""
        from spark_runtime.checkpoint import last_committed_batch, read_offsets

        ckpt = self.shard_dir(task, shard) / "checkpoint"
        try:
            bid = last_committed_batch(ckpt)
            if bid < 0:
                return bid, None
            positions = next(o for o in read_offsets(ckpt, bid) if isinstance(o, dict))
        except (OSError, StopIteration, ValueError):
            return -1, None
        return bid, {k: int(v) for k, v in positions.items()}

    # ------------------------------------------------------------ steps
    def start(self) -> None:
        from kubernetes import client, config

        from localkube.cluster import LocalCluster

        say("starting the local control plane with the node agent")
        self.cluster = LocalCluster(self.run_dir / "cluster", binaries=self.binaries, agent_env_path=[VENV_BIN])
        self.cluster.start()
        self.cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        self.cluster.kubectl(
            "wait", "--for=condition=Established", "crd/tasks.taskshard.io", "crd/taskshards.taskshard.io"
        )
        self.cluster.kubectl("create", "namespace", NAMESPACE)
        wait_served(self.cluster, NAMESPACE, "tasks.taskshard.io", "taskshards.taskshard.io")
        kubectl_retry(self.cluster, "apply", "-f", str(RBAC), namespace=NAMESPACE)
        log = open(self.run_dir / "operator.log", "wb")  # noqa: SIM115 - owned by the child
        cmd = [sys.executable, "-m", "taskshard_operator", "--namespace", NAMESPACE, "--standalone", "--liveness", ""]
        self.operator = subprocess.Popen(cmd, env=self.cluster.env(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)

    def run_one(
        self,
        repeat: int,
        mode: str,
        inputs: dict[int, bytes],
        warmup: dict[int, bytes],
        warm_reference: Counter,
        reference: Counter,
        conf: dict[str, str],
    ) -> dict[str, Any]:
        """One Task, one shard: warm up, then time the input (module docstring)."""
        import yaml
        from scaling import append_all, journal_ends

        from taskshard_operator.naming import pod_name

        args = self.args
        task = f"{'local' if mode == 'local' else 'exec'}{repeat}"
        shard = f"{task}-0-{MAX_KEY_GROUPS}"
        driver = pod_name(shard)
        journal = self.data / "journal" / task
        journal.mkdir(parents=True, exist_ok=True)
        append_all(journal, warmup)
        self.task = task
        t_apply = time.monotonic()
        kubectl_retry(
            self.cluster,
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(task_manifest(task, mode, args, conf)),
            namespace=NAMESPACE,
        )
        say(f"{MODES[mode]}, repeat {repeat}: Task {task} applied, warming up ({args.warmup_events:,} events)")
        want = args.executors if mode == "executors" else 0

        def ready() -> bool:
            pods = self.shard_pods(shard)
            execs = [p for p in pods if is_executor(p) and container_pid(p) is not None]
            return len(execs) >= want and {str(k): int(v) for k, v in self.results(task).items()} == warm_reference

        self.wait(
            f"{shard}: warm-up results exact" + (f", {want} executors running" if want else ""),
            ready,
            args.timeout,
            2.0,
        )
        startup = time.monotonic() - t_apply
        say(f"{MODES[mode]}, repeat {repeat}: warm after {startup:.0f}s")

        def roots() -> dict[str, int]:
            out = {}
            for p in self.shard_pods(shard):
                pid = container_pid(p)
                if pid is not None:
                    out[f"{p['metadata']['name']}@{pid}"] = pid
            return out

        start_roots = roots()
        if not any(label.startswith(f"{driver}@") for label in start_roots):
            raise RuntimeError(f"no running container of {driver}: {sorted(start_roots)}")
        cpu = PodTreeCpu(start_roots, interval=1.0)
        cpu.start()
        try:
            idle0 = cpu.reading(threads=False)
            time.sleep(args.settle)
            idle1 = cpu.reading(threads=False)
            idle_cores = cpu.seconds(idle0, idle1) / args.settle
            exec_pods = sorted({label.split("@")[0] for label in cpu.roots if not label.startswith(f"{driver}@")})
            tasks0 = self.executor_tasks(exec_pods)
            batch0, _ = self.committed(task, shard)
            before = cpu.reading()
            machine0 = MachineCpu()
            load1 = round(os.getloadavg()[0], 2)
            t0 = time.time()
            append_all(journal, inputs)
            ends = journal_ends(journal, PARTITIONS)
            deadline = time.monotonic() + args.timeout
            listed = time.monotonic()
            while True:
                bid, positions = self.committed(task, shard)
                if positions == ends:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{shard} did not catch up to {ends} within {args.timeout:.0f} s (batch {bid}: {positions})"
                    )
                if time.monotonic() - listed >= 1.0:  # an executor started in the window counts from its start
                    listed = time.monotonic()
                    for label, pid in roots().items():
                        if cpu.add(label, pid):
                            say(f"  {label.split('@')[0]} (pid {pid}) appeared in the window: measured from now")
                    self.check_operator()
                time.sleep(0.1)
            after = cpu.reading()
            steal = machine_between(machine0, MachineCpu())
        finally:
            cpu.stop()
        t1 = mtime(self.shard_dir(task, shard) / "checkpoint" / "commits" / str(bid)) or time.time()
        seconds = t1 - t0
        labels = list(after["cpu"])
        driver_labels = [lb for lb in labels if lb.startswith(f"{driver}@")]
        exec_labels = [lb for lb in labels if lb not in driver_labels]
        driver_cpu = sum(cpu.seconds(before, after, lb) for lb in driver_labels)
        exec_cpu = sum(cpu.seconds(before, after, lb) for lb in exec_labels)
        total = driver_cpu + exec_cpu
        all_exec_pods = sorted({lb.split("@")[0] for lb in exec_labels})
        tasks1 = self.executor_tasks(all_exec_pods)

        def kinds(group: list[str]) -> dict[str, float]:
            out = dict.fromkeys(CPU_KINDS, 0.0)
            for lb in group:
                for k, v in cpu.kinds(before, after, lb).items():
                    out[k] += v
            return {k: round(v, 2) for k, v in out.items()}

        by_group = {"driver": kinds(driver_labels)}
        if mode == "executors":
            by_group["executors"] = kinds(exec_labels)
        # Exact results: the warm-up and the timed input, counted in plain Python.
        found: dict[str, Any] = {}
        check: dict[str, Any] = {}
        deadline = time.monotonic() + args.results_timeout
        while True:
            found = self.results(task)
            check = compare_counts(found, reference)
            if check["exact"] or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        if not check["exact"]:
            say(f"!!! {MODES[mode]}, repeat {repeat}: RESULTS NOT EXACT: {json.dumps(check)}")
        result = {
            "repeat": repeat,
            "mode": mode,
            "task": task,
            "shard": shard,
            "events": args.events,
            "startupSeconds": round(startup, 2),
            "seconds": round(seconds, 3),
            "eventsPerSecond": round(args.events / seconds),
            "batches": bid - batch0,
            "firstBatch": batch0 + 1,
            "lastBatch": bid,
            "cpuSeconds": round(total, 2),
            "driverCpuSeconds": round(driver_cpu, 2),
            "executorCpuSeconds": round(exec_cpu, 2),
            "executorShare": round(exec_cpu / total, 3) if mode == "executors" and total > 0 else None,
            "cpuMicrosPerEvent": round(total / args.events * 1e6, 2),
            "cpuKinds": {k: round(sum(g[k] for g in by_group.values()), 2) for k in CPU_KINDS},
            "cpuKindsByGroup": by_group,
            "cpuByPod": {lb: round(cpu.seconds(before, after, lb), 2) for lb in labels},
            "executorPods": all_exec_pods,
            "executorPodsAtStart": exec_pods,
            "executorTasks": {p: tasks1.get(p, 0) - tasks0.get(p, 0) for p in all_exec_pods},
            "idleCores": round(idle_cores, 3),
            "machine": steal,
            "stealPercent": steal["stealPercent"],
            "load1": load1,
            "exact": check["exact"],
            "check": check,
        }
        say(
            f"{MODES[mode]}, repeat {repeat}: {seconds:.2f}s, {result['eventsPerSecond']:,} events/s, "
            f"{result['batches']} batches, CPU {total:.1f}s ({result['cpuMicrosPerEvent']:.1f} µs/event; executors "
            f"{exec_cpu:.1f}s), steal {steal['stealPercent']}%, exact={check['exact']}"
        )
        self.end_task(task, keep=not check["exact"])
        return result

    def end_task(self, task: str, keep: bool = False) -> None:
        """Delete the Task, wait until its pods (driver, executors) are gone, drop its files (kept when ``keep``)."""
        say(f"deleting Task {task}")
        self.cluster.kubectl(
            "delete", "task", task, "--wait=true", "--timeout=300s", namespace=NAMESPACE, check=False, timeout=330
        )
        self.wait(f"the pods of {task} gone", lambda: not self.pods(f"{LABEL_TASK}={task}"), 300, 1.0)
        self.task = None
        if not keep:
            for part in ("journal", "output", "state"):
                shutil.rmtree(self.data / part / task, ignore_errors=True)

    def stop(self) -> None:
        try:
            if self.task and self.cluster is not None and self.operator is not None and self.operator.poll() is None:
                say(f"deleting Task {self.task} (its pods drain and stop)")
                self.cluster.kubectl(
                    "delete",
                    "task",
                    self.task,
                    "--wait=true",
                    "--timeout=300s",
                    namespace=NAMESPACE,
                    check=False,
                    timeout=330,
                )
        finally:
            if self.operator is not None and self.operator.poll() is None:
                self.operator.terminate()
                try:
                    self.operator.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self.operator.kill()
            if self.cluster is not None:
                self.cluster.stop()


# ---------------------------------------------------------------- the plot


def plot(results: list[dict[str, Any]], summary: dict[str, Any], path: Path, title: str) -> None:
    """Bars per mode (medians), each run as a dot: events/s, and CPU µs per event split into driver and executors."""
    plt = pyplot()
    modes = list(summary["modes"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    colors = {"local": "#1f77b4", "executors": "#ff7f0e"}
    xs = range(len(modes))
    eps = [summary["modes"][m]["eventsPerSecond"] or 0 for m in modes]
    a1.bar(xs, eps, color=[colors[m] for m in modes], width=0.6)
    for x, m, y in zip(xs, modes, eps, strict=True):
        runs = [r["eventsPerSecond"] for r in results if r["mode"] == m]
        a1.plot([x] * len(runs), runs, "o", color="black", ms=4)
        a1.text(x, y, f"{y:,.0f}", ha="center", va="bottom", fontsize=8)
    a1.set_xticks(list(xs), [MODES[m] for m in modes], fontsize=8)
    a1.set_ylabel("input events per second (median; dots: runs)")
    a1.set_title("throughput", fontsize=10)

    def med(m: str, field: str) -> float:
        return median([r[field] / r["events"] * 1e6 for r in results if r["mode"] == m]) or 0.0

    driver = [med(m, "driverCpuSeconds") for m in modes]
    execs = [med(m, "executorCpuSeconds") for m in modes]
    a2.bar(xs, driver, color="#7f7f7f", width=0.6, label="driver pod")
    a2.bar(xs, execs, bottom=driver, color="#ff7f0e", width=0.6, label="executor pods")
    for x, m in zip(xs, modes, strict=True):
        total = summary["modes"][m]["cpuMicrosPerEvent"] or 0
        runs = [r["cpuMicrosPerEvent"] for r in results if r["mode"] == m]
        a2.plot([x] * len(runs), runs, "o", color="black", ms=4)
        a2.text(x, total, f"{total:.1f}", ha="center", va="bottom", fontsize=8)
    a2.set_xticks(list(xs), [MODES[m] for m in modes], fontsize=8)
    a2.set_ylabel("CPU µs per input event (median; dots: runs)")
    a2.set_title("CPU cost (all processes of the shard's pods)", fontsize=10)
    a2.legend(fontsize=8)
    fig.suptitle(
        "\n".join(textwrap.wrap(title, 110))
        + f"\non {os.cpu_count()} cores the executors share the driver's cores: this shows their overhead, not a "
        "speed-up",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=300_000, help="timed input events (default 300,000)")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20,000)")
    ap.add_argument("--warmup-events", type=int, default=20_000, help="untimed events first (default 20,000)")
    ap.add_argument("--modes", default="local,executors", help="comma-separated: local, executors (default both)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each mode, interleaved (default 3)")
    ap.add_argument("--executors", type=int, default=2, help="executor pods in the executors mode (default 2)")
    ap.add_argument(
        "--executor-memory",
        default="1Gi",
        help="each executor's memory limit (default 1Gi, the least a shard pod may have)",
    )
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the timed input is cut into (default 10)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--trigger", default="200 milliseconds", help="trigger interval (default 200 milliseconds)")
    ap.add_argument("--settle", type=float, default=5.0, help="idle seconds before the timed input (default 5)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for each wait of a run (default 900)")
    ap.add_argument(
        "--results-timeout", type=float, default=120, help="seconds for the results to become exact (default 120)"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # paths go into hostPath volumes
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: {unknown} unknown; choose from {list(MODES)}")
    if args.executors < 1:
        ap.error("--executors must be at least 1")

    from scaling import write_input

    bench = Bench(args)
    bench.run_dir.mkdir(parents=True)
    inputs_dir = bench.run_dir / "input"
    nbytes, per_key = write_input(inputs_dir / "timed", args.events, args.keys, PARTITIONS, args.seed)
    inputs = {p: (inputs_dir / "timed" / f"p{p}.jsonl").read_bytes() for p in range(PARTITIONS)}
    _, warm_keys = write_input(inputs_dir / "warmup", args.warmup_events, args.keys, PARTITIONS, args.seed + 1)
    warmup = {p: (inputs_dir / "warmup" / f"p{p}.jsonl").read_bytes() for p in range(PARTITIONS)}
    inputs = {p: d for p, d in inputs.items() if d}
    warmup = {p: d for p, d in warmup.items() if d}
    reference = warm_keys + per_key
    say(f"input: {args.events:,} events over {len(per_key):,} keys, {nbytes / 1e6:.1f} MB in {PARTITIONS} partitions")
    conf = {
        "spark.sql.shuffle.partitions": str(args.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.taskshard.maxBytesPerTrigger": str(math.ceil(nbytes / args.batches) + 1024),
    }
    results: list[dict[str, Any]] = []
    with LoadSampler() as load:
        try:
            bench.start()
            for rep in range(1, args.repeat + 1):
                for mode in modes:
                    results.append(bench.run_one(rep, mode, inputs, warmup, warm_keys, reference, conf))
        finally:
            bench.stop()
    load_summary = load.summary()
    summary = summarize(results, modes)
    cores = os.cpu_count() or 1
    title = (
        f"One shard with {args.executors} executor pods against local mode: {args.events:,} events, {args.keys:,} "
        f"keys, {nbytes / 1e6:.1f} MB in {PARTITIONS} partitions, builtin count, maxBytesPerTrigger = input / "
        f"{args.batches}, {cores} cores"
    )
    tables = [
        (title, RUN_COLUMNS, run_rows(results)),
        ("Medians over the repeats, and executors / local", SUMMARY_COLUMNS, summary_rows(summary)),
        ("Each repeat's pair (the two modes ran one after the other)", PAIR_COLUMNS, pair_rows(summary)),
        ("Where the CPU went in the timed window, by pod group and kind", KIND_COLUMNS, kind_rows(results)),
    ]
    for i, (t, c, r) in enumerate(tables):
        print_table(t, c, r, load_summary if i == 0 else None)
    goals = targets(results, summary, args.executors)
    for g in goals:
        say(f"target {g['name']}: {g['value']} ({g['target']}): {'met' if g['met'] else 'MISSED'}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(results, summary, args.out / f"{NAME}.png", title)
    notes = [
        f"Both modes run the same Task but for spec.spark.executors (instances {args.executors}, memory limit "
        f"{args.executor_memory}, one core each: {args.executors} task slots against local[2]'s 2) and its service "
        "account; a fresh Task per run, the previous one deleted and its pods gone first; the modes alternate "
        f"({args.repeat} repeat{'s' if args.repeat != 1 else ''}), so slow drifts of the machine's load hit both "
        "alike.",
        f"The input is generated once (bench/scaling.py's write_input, seed {args.seed}) and appended to each run's "
        f"empty journal after a warm-up of {args.warmup_events:,} events was consumed (start-up, JVMs, the first "
        "batches' one-off costs: excluded); the clock runs from that append to the commit (mtime of "
        "checkpoint/commits/<N>) of the batch whose end positions are the journal's ends.",
        "CPU = user + system seconds of every process of the shard's pods over the timed window: the driver pod's "
        "process tree and each executor pod's (JVM, Python runtime, Spark's Python workers), found through the "
        "container ids (the node agent's container id is the pid of the container's process group); /proc, sampled "
        "every second and at both ends by proc_cpu.TreeCpu; an executor pod that appears in the window counts from "
        "its start. The control plane, node agent and operator are not counted (the same in both modes); 'machine "
        "busy' is all of this VM's busy time in the window (other engineers' work included).",
        "'executors' share' = the executor pods' CPU / the shard's CPU in the window; 'tasks finished on executors' "
        "counts the executors' 'Executor: Finished task' log lines in the window; 'idle CPU before' is what the "
        f"shard's pods used in the {args.settle:.0f} s before the append, with nothing to read.",
        "Results exact = the per-key counts (spark_runtime.results.final_results over the sink and the committed "
        "batches) equal a plain-Python count of the warm-up and the timed input; a run that is not exact fails the "
        "benchmark.",
        "The ratios are executors / local of the medians over the repeats (the paired table has each repeat's own).",
        f"CPU steal % = the share of this VM's CPU time the hypervisor gave to other guests in the window "
        f"(/proc/stat). On {cores} cores the executors compete with the driver (and each other) for the same cores, "
        "so this measures their overhead, not a speed-up: executors add task slots where they get cores of their "
        "own (other nodes).",
    ]
    payload = {
        "title": "Executors on Kubernetes against local mode",
        "command": command_line(argv),
        "parameters": vars(args) | {"out": str(args.out), "data": str(args.data)},
        "machine": machine(),
        "load": load_summary,
        "tables": [{"title": t, "columns": c, "rows": r} for t, c, r in tables],
        "targets": goals,
        "plots": [f"{NAME}.png"],
        "notes": notes,
        "raw": {
            "inputBytes": nbytes,
            "partitions": PARTITIONS,
            "keys": len(reference),
            "summary": summary,
            "results": results,
            "runDir": str(bench.run_dir),
        },
    }
    from run_all import findings

    lines = findings(NAME, payload)
    if lines:
        print("\nWhat the numbers say:", flush=True)
        for line in lines:
            print(f"- {line}", flush=True)
    write_result(args.out, NAME, payload)
    bad = [r for r in results if not r["exact"]]
    if bad:
        say(
            "FAILED: results not exact in "
            + ", ".join(f"{MODES[r['mode']]} repeat {r['repeat']}" for r in bad)
            + f" (their files are kept under {bench.data})"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
