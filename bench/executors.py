"""Executors on Kubernetes against local mode: one shard's throughput and CPU per event, with Spark executor pods
and with Spark's local mode inside its driver pod.

On the bed (``hack/operator_bed.py``, with the driver's RBAC), ``--repeat`` rounds of ``--modes`` in turn, each a
fresh one-shard Task (builtin count): ``local`` runs ``local[2]`` in the driver pod, ``executors`` adds ``--executors``
executor pods. Each run warms up, idles ``--settle`` s, appends the timed input and stops the clock at the commit
that reaches the journal's ends; the per-key results must equal a plain-Python count (else exit code 1). CPU: every
process of the shard's pods (a container's process is its id, ``local://<pid>``); the rest is in :func:`notes`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, LoadSampler, bed_task, median, mtime, options, parse, publish, pyplot, ratio, say, target  # noqa: E402
from operator_bed import OperatorBed  # noqa: E402
from proc_cpu import CPU_KINDS, MachineCpu, TreeCpu, machine_between  # noqa: E402

NAME = "executors"
NAMESPACE = "bench-executors"
MAX_KEY_GROUPS = 128
PARTITIONS = 4
RBAC = REPO / "docs" / "examples" / "spark-driver-rbac.yaml"
SERVICE_ACCOUNT = "taskshard-spark"
LABEL_SHARD, LABEL_COMPONENT = "taskshard.io/shard", "taskshard.io/component"
MODES = {"local": "local mode (local[2] in the driver pod)", "executors": "executors on Kubernetes"}
"""``--modes`` values and their labels in the tables."""
FINISHED_TASK = "Executor: Finished task"
"""What an executor's log says for each task it finished."""


def container_pid(pod: dict[str, Any]) -> int | None:
    """The process id of a running pod's container (the node agent's container id ``local://<pid>``)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        tail = (cs.get("containerID") or "").partition("://")[2]
        if "running" in (cs.get("state") or {}) and tail.isdigit():
            return int(tail)
    return None


def task_manifest(task: str, mode: str, args: argparse.Namespace, conf: dict[str, str]) -> dict[str, Any]:
    """The Task of one run; the ``executors`` mode adds only the executors and the driver's service account."""
    spark: dict[str, Any] = {"conf": dict(conf), "triggerInterval": args.trigger}
    if mode == "executors":
        spark["serviceAccountName"] = SERVICE_ACCOUNT
        spark["executors"] = {"instances": args.executors, "resources": {"limits": {"memory": args.executor_memory}}}
    return bed_task(task, NAMESPACE, args.data, PARTITIONS, spark, maxKeyGroups=MAX_KEY_GROUPS)


def compare_counts(found: dict[str, Any], expected: Counter | dict[str, int]) -> dict[str, Any]:
    """How the shard's per-key results differ from the plain-Python count."""
    got = {str(k): int(v) for k, v in found.items()}
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    return {
        "exact": not (missing or extra or wrong), "keys": len(got), "expectedKeys": len(expected),
        "eventsCounted": sum(got.values()), "eventsExpected": sum(expected.values()), "missingKeys": len(missing),
        "extraKeys": len(extra), "wrongKeys": len(wrong),
        "examples": {k: [got.get(k), expected.get(k)] for k in (missing + extra + wrong)[:5]},
    }  # fmt: skip


MEDIANS = ("seconds", "eventsPerSecond", "cpuSeconds", "cpuMicrosPerEvent", "executorShare", "idleCores",
           "stealPercent")  # fmt: skip
"""The fields :func:`medians` takes the median of, per mode."""


def medians(results: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Medians per mode over the repeats; executors / local: of the medians (the headline) and of each repeat."""
    per_mode: dict[str, dict[str, Any]] = {}
    for mode in modes:
        rows = [r for r in results if r["mode"] == mode]
        per_mode[mode] = {
            "runs": len(rows),
            **{f: median([r.get(f) for r in rows]) for f in MEDIANS},
            "cpuKinds": {k: median([r["cpuKinds"].get(k) for r in rows]) for k in CPU_KINDS},
            "exact": all(r["exact"] for r in rows) if rows else None,
        }

    def ratios(e: dict[str, Any], lo: dict[str, Any]) -> dict[str, float | None]:
        return {"eventsPerSecond": ratio(e.get("eventsPerSecond"), lo.get("eventsPerSecond")),
                "cpuPerEvent": ratio(e.get("cpuMicrosPerEvent"), lo.get("cpuMicrosPerEvent"))}  # fmt: skip

    local, execs = per_mode.get("local") or {}, per_mode.get("executors") or {}
    pairs = [{r["mode"]: r for r in results if r["repeat"] == rep} for rep in sorted({r["repeat"] for r in results})]
    paired = [{"repeat": p["local"]["repeat"], **ratios(p["executors"], p["local"])} for p in pairs if len(p) == 2]
    overall = ratios(execs, local) | {"cpuSeconds": ratio(execs.get("cpuSeconds"), local.get("cpuSeconds"))}
    return {"modes": per_mode, "ratios": overall | {"paired": paired}}


def _pct(share: float | None) -> float | None:
    return round(100 * share, 1) if share is not None else None


RUN_COLUMNS = [
    "repeat", "mode", "executor pods", "append -> caught up s", "events/s", "batches", "CPU s (the shard's pods)",
    "driver CPU s", "executors CPU s", "executors' share of the CPU %", "CPU µs / event",
    "tasks finished on executors", "idle CPU before (cores)", "machine busy CPU s", "CPU steal %",
    "load (1 min) at the append", "results exact",
]  # fmt: skip


def run_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per run (``RUN_COLUMNS``)."""
    return [
        [r["repeat"], MODES[r["mode"]], len(r["executorPods"]) if r["mode"] == "executors" else None, r["seconds"],
         r["eventsPerSecond"], r["batches"], r["cpuSeconds"], r["driverCpuSeconds"],
         r["executorCpuSeconds"] if r["mode"] == "executors" else None, _pct(r.get("executorShare")),
         r["cpuMicrosPerEvent"], sum(r["executorTasks"].values()) if r["mode"] == "executors" else None,
         r["idleCores"], r["machine"]["busy"], r["stealPercent"], r["load1"], r["exact"]]
        for r in results
    ]  # fmt: skip


SUMMARY_COLUMNS = [
    "mode", "runs", "append -> caught up s (median)", "events/s (median)", "CPU s (median)", "CPU µs / event (median)",
    "executors' share of the CPU % (median)", "CPU steal % (median)", "results exact",
]  # fmt: skip


def summary_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """One row per mode and, with both modes, the ratio executors / local of the medians (``SUMMARY_COLUMNS``)."""
    modes = summary["modes"]
    rows: list[list[Any]] = [
        [MODES[mode], m["runs"], m["seconds"], m["eventsPerSecond"], m["cpuSeconds"], m["cpuMicrosPerEvent"],
         _pct(m.get("executorShare")), m["stealPercent"], m["exact"]]
        for mode, m in modes.items()
    ]  # fmt: skip
    if "local" in modes and "executors" in modes:
        r = summary["ratios"]
        seconds = ratio(modes["executors"]["seconds"], modes["local"]["seconds"])
        rows.append(["executors / local (ratio of the medians)", None, seconds, r["eventsPerSecond"], r["cpuSeconds"]])
        rows[-1] += [r["cpuPerEvent"], None, None, None]
    return rows


KIND_COLUMNS = ["repeat", "mode", "pods", *[f"{k} s" for k in CPU_KINDS], "total CPU s"]


def kind_rows(results: list[dict[str, Any]]) -> list[list[Any]]:
    """Where each run's CPU went, by pod group (the driver, the executors) and kind (``KIND_COLUMNS``)."""
    return [
        [r["repeat"], MODES[r["mode"]], group, *[kinds.get(k) for k in CPU_KINDS], sum(kinds.values())]
        for r in results
        for group, kinds in r["cpuKindsByGroup"].items()
    ]


PAIR_COLUMNS = ["repeat", "events/s: executors / local", "CPU per event: executors / local"]


def pair_rows(summary: dict[str, Any]) -> list[list[Any]]:
    return [[p["repeat"], p["eventsPerSecond"], p["cpuPerEvent"]] for p in summary["ratios"]["paired"]]


def targets(results: list[dict[str, Any]], summary: dict[str, Any], executors: int) -> list[dict[str, Any]]:
    """The Targets rows: exact results with executors, and two ratios against local mode (met when measured)."""
    runs = [r for r in results if r["mode"] == "executors"]
    exact, n = [r for r in runs if r["exact"]], f"{executors} executors"
    local, execs = summary["modes"].get("local") or {}, summary["modes"].get("executors") or {}
    wrong = "; ".join(
        f"repeat {r['repeat']}: {c['wrongKeys']} keys wrong, {c['missingKeys']} missing, {c['extraKeys']} unexpected "
        f"({c['eventsCounted']:,} of {c['eventsExpected']:,} events counted)"
        for r in runs
        if not r["exact"] and (c := r["check"])
    )

    def reported(what: str, key: str, field: str, spec: str, unit: str) -> dict[str, Any]:
        r = summary["ratios"].get(key)
        value = f"{r:.2f}x ({execs[field]:{spec}} vs {local[field]:{spec}} {unit}, medians)" if r is not None else ""
        name = f"{n}: {what} vs local mode (ratio; reported)"
        return target(name, "reported", value or "not measured", r is not None)

    value = runs and f"exact in {len(exact)} of {len(runs)} runs ({runs[0]['events']:,} events, plain-Python count)"
    return [
        target(f"{n}: results exact", "exact", value or "not measured", bool(runs) and len(exact) == len(runs),
               f"Per-key results against the plain-Python count: {wrong}" if wrong else None),
        reported("events/s", "eventsPerSecond", "eventsPerSecond", ",.0f", "events/s"),
        reported("CPU per event", "cpuPerEvent", "cpuMicrosPerEvent", ".1f", "CPU µs / event"),
    ]  # fmt: skip


def summarize(data: dict[str, Any]) -> list[str]:
    """The "What the numbers say" lines of ``executors.json``."""
    summary, results, params = data["raw"]["summary"], data["raw"]["results"], data.get("parameters") or {}
    cores = (data.get("machine") or {}).get("cores") or os.cpu_count() or 1
    local, execs, ratios = summary["modes"].get("local"), summary["modes"].get("executors"), summary["ratios"]
    eps, cpu, out = ratios.get("eventsPerSecond"), ratios.get("cpuPerEvent"), []
    if local and execs and eps is not None and cpu is not None:
        paired = [p for p in ratios.get("paired") or [] if None not in (p.get("eventsPerSecond"), p.get("cpuPerEvent"))]
        pairs = [f"repeat {p['repeat']}: events/s {p['eventsPerSecond']:.2f}x, CPU per event {p['cpuPerEvent']:.2f}x"
                 for p in paired]  # fmt: skip
        kinds = [f"{k} {local['cpuKinds'].get(k) or 0:.1f} / {execs['cpuKinds'].get(k) or 0:.1f}"
                 for k in CPU_KINDS if k in (execs.get("cpuKinds") or {})]  # fmt: skip
        verdict = (f"here they were {1 - eps:.0%} slower and cost {cpu - 1:.0%} more CPU per event" if eps < 1 < cpu
                   else f"here the ratios were {eps:.2f}x (events/s) and {cpu:.2f}x (CPU per event)")  # fmt: skip
        out += [
            f"With {params.get('executors', 2)} executor pods the shard processed {params.get('events', 0):,} events "
            f"at {execs['eventsPerSecond']:,.0f} events/s against {local['eventsPerSecond']:,.0f} in local mode "
            f"({eps:.2f}x), at {execs['cpuMicrosPerEvent']:.1f} CPU µs per event against "
            f"{local['cpuMicrosPerEvent']:.1f} ({cpu:.2f}x; medians over {execs['runs']} and {local['runs']} runs, all "
            "processes of the shard's pods).",
            *([f"The executor pods did {execs['executorShare']:.0%} of the shard's CPU work in the window; the driver "
               "still plans and commits every micro-batch, the executors' tasks read, aggregate and update the state "
               "store."] if execs.get("executorShare") is not None else []),
            *([f"Each repeat's pair (executors / local): {', '.join(pairs)}."] if pairs else []),
            *([f"CPU seconds in the window by kind (medians), local mode / executors: {', '.join(kinds)}. Each "
               "executor is a fresh JVM whose JIT compilers compile the code again."] if kinds else []),
            f"On this {cores}-core machine the executors compete with the driver for the same {cores} cores, so this "
            f"shows the overhead of executors, not a speed-up ({verdict}): more JVMs and Python workers, tasks and "
            "shuffle blocks shipped between processes. Executors add task slots only on cores of their own (other "
            "nodes), for a range a split cannot divide (docs/executors.md).",
        ]  # fmt: skip
    bad = ", ".join(f"{r['mode']} repeat {r['repeat']}" for r in results if not r.get("exact"))
    steal = [r["stealPercent"] for r in results if r.get("stealPercent") is not None]
    return [
        *out,
        f"Results NOT exact in {bad} (per-key counts against the plain-Python count): a correctness bug." if bad
        else f"Results exact in all {len(results)} runs: the per-key counts equal the plain-Python count.",
        f"CPU steal during the timed windows: {f'{min(steal):.1f}-{max(steal):.1f}%' if steal else 'not recorded'} of "
        "this VM's CPU time (/proc/stat).",
    ]  # fmt: skip


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


class Bench:
    """The bed, and one Task at a time on it (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_dir = (args.out / "work" / NAME / time.strftime("%Y%m%d-%H%M%S")).resolve()
        self.data = args.data = self.run_dir / "data"
        self.bed = OperatorBed(self.run_dir, NAMESPACE, manifests=[RBAC])
        self.core: Any = None  # the Kubernetes client: lighter than a kubectl process every second in the window
        self.task: str | None = None

    def start(self) -> None:
        from kubernetes import client, config

        say("starting the local control plane with the node agent, the driver's RBAC and the operator")
        self.bed.start()
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=str(self.bed.kubeconfig)))

    def roots(self, shard: str) -> dict[str, int]:
        """``<pod>@<pid>`` -> pid of each running container of the shard's driver and executor pods (not deleted)."""
        selector = f"{LABEL_SHARD}={shard},{LABEL_COMPONENT} in (shard,executor)"
        items = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        pods = [self.core.api_client.sanitize_for_serialization(p) for p in items]
        pids = {p["metadata"]["name"]: container_pid(p) for p in pods if not p["metadata"].get("deletionTimestamp")}
        return {f"{name}@{pid}": pid for name, pid in pids.items() if pid is not None}

    def results(self, task: str) -> dict[str, Any]:
        from spark_runtime.results import final_results

        try:
            return final_results(self.data / "output" / task, self.data / "state", task)
        except (OSError, ValueError, KeyError):
            return {}

    def executor_tasks(self, pods: list[str]) -> dict[str, int]:
        """Tasks each executor pod has finished so far (its log's ``Executor: Finished task`` lines)."""
        logs = {pod: self.bed.cluster.pod_log_path(NAMESPACE, pod, "executor") for pod in pods}
        return {pod: p.read_text(errors="replace").count(FINISHED_TASK) if p.exists() else 0 for pod, p in logs.items()}

    def committed(self, task: str, shard: str) -> tuple[int, dict[str, int] | None]:
        """The shard's last committed batch and its journal end positions (None before its first commit)."""
        from spark_runtime.checkpoint import last_committed_batch, read_offsets

        ckpt = self.data / "state" / task / "shards" / shard / "checkpoint"
        try:
            if (bid := last_committed_batch(ckpt)) < 0:
                return bid, None
            positions = next(o for o in read_offsets(ckpt, bid) if isinstance(o, dict))
        except (OSError, StopIteration, ValueError):
            return -1, None
        return bid, {k: int(v) for k, v in positions.items()}

    def warm_up(self, task: str, shard: str, mode: str, warmup: dict, expected: Counter, conf: dict) -> float:
        """Apply the Task over the warm-up input; seconds until its results are exact (and all executors run)."""
        import yaml
        from scaling import append_all

        from taskshard_operator.naming import pod_name

        (self.data / "journal" / task).mkdir(parents=True, exist_ok=True)
        append_all(self.data / "journal" / task, warmup)
        self.task, t_apply = task, time.monotonic()
        self.bed.kubectl_retry("apply", "-f", "-", input=yaml.safe_dump(task_manifest(task, mode, self.args, conf)))
        say(f"{MODES[mode]}: Task {task} applied, warming up ({self.args.warmup_events:,} events)")
        want = self.args.executors if mode == "executors" else 0

        def ready() -> bool:
            execs = [label for label in self.roots(shard) if not label.startswith(f"{pod_name(shard)}@")]
            return len(execs) >= want and {str(k): int(v) for k, v in self.results(task).items()} == expected

        what = f"{shard}: warm-up results exact" + (f", {want} executors running" if want else "")
        self.bed.wait(what, ready, self.args.timeout, 2.0)
        return time.monotonic() - t_apply

    def catch_up(self, task: str, shard: str, ends: dict[str, int], cpu: PodTreeCpu) -> int:
        """The id of the batch that reaches ``ends``, once committed; an executor that starts meanwhile is measured."""
        listed = time.monotonic()
        deadline = listed + self.args.timeout
        while (done := self.committed(task, shard))[1] != ends:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{shard} did not catch up to {ends} in {self.args.timeout:.0f} s (batch {done})")
            if time.monotonic() - listed >= 1.0:
                listed = time.monotonic()
                for label, pid in self.roots(shard).items():
                    if cpu.add(label, pid):
                        say(f"  {label.split('@')[0]} (pid {pid}) appeared in the window: measured from now")
                self.bed.check_operator()
            time.sleep(0.1)
        return done[0]

    def timed_window(self, task: str, shard: str, mode: str, inputs: dict[int, bytes]) -> dict[str, Any]:
        """Idle ``--settle`` s, append ``inputs``, wait until caught up: the run's time and CPU fields."""
        from scaling import append_all, journal_ends

        from taskshard_operator.naming import pod_name

        args, driver, journal = self.args, pod_name(shard), self.data / "journal" / task
        start_roots = self.roots(shard)
        if not any(label.startswith(f"{driver}@") for label in start_roots):
            raise RuntimeError(f"no running container of {driver}: {sorted(start_roots)}")
        cpu = PodTreeCpu(start_roots, interval=1.0)
        cpu.start()
        try:
            idle0 = cpu.reading(threads=False)
            time.sleep(args.settle)
            idle_cores = cpu.seconds(idle0, cpu.reading(threads=False)) / args.settle
            exec_pods = sorted({label.split("@")[0] for label in cpu.roots if not label.startswith(f"{driver}@")})
            tasks0, (batch0, _) = self.executor_tasks(exec_pods), self.committed(task, shard)
            before, machine0, load1, t0 = cpu.reading(), MachineCpu(), round(os.getloadavg()[0], 2), time.time()
            append_all(journal, inputs)
            bid = self.catch_up(task, shard, journal_ends(journal, PARTITIONS), cpu)
            after, steal = cpu.reading(), machine_between(machine0, MachineCpu())
        finally:
            cpu.stop()
        commit = self.data / "state" / task / "shards" / shard / "checkpoint" / "commits" / str(bid)
        seconds = (mtime(commit) or time.time()) - t0
        labels = list(after["cpu"])
        groups = {"driver": [lb for lb in labels if lb.startswith(f"{driver}@")]}
        groups["executors"] = [lb for lb in labels if lb not in groups["driver"]]
        used = {g: sum(cpu.seconds(before, after, lb) for lb in lbs) for g, lbs in groups.items()}
        total = used["driver"] + used["executors"]
        by_group = {}
        for g in ("driver", "executors") if mode == "executors" else ("driver",):
            kinds = [cpu.kinds(before, after, lb) for lb in groups[g]]
            by_group[g] = {k: round(sum(kd[k] for kd in kinds), 2) for k in CPU_KINDS}
        pods = sorted({lb.split("@")[0] for lb in groups["executors"]})
        tasks1 = self.executor_tasks(pods)
        return {
            "seconds": round(seconds, 3), "eventsPerSecond": round(args.events / seconds), "batches": bid - batch0,
            "firstBatch": batch0 + 1, "lastBatch": bid, "cpuSeconds": round(total, 2),
            "driverCpuSeconds": round(used["driver"], 2), "executorCpuSeconds": round(used["executors"], 2),
            "executorShare": round(used["executors"] / total, 3) if mode == "executors" and total > 0 else None,
            "cpuMicrosPerEvent": round(total / args.events * 1e6, 2),
            "cpuKinds": {k: round(sum(g[k] for g in by_group.values()), 2) for k in CPU_KINDS},
            "cpuKindsByGroup": by_group, "cpuByPod": {lb: round(cpu.seconds(before, after, lb), 2) for lb in labels},
            "executorPods": pods, "executorPodsAtStart": exec_pods,
            "executorTasks": {p: tasks1.get(p, 0) - tasks0.get(p, 0) for p in pods}, "idleCores": round(idle_cores, 3),
            "machine": steal, "stealPercent": steal["stealPercent"], "load1": load1,
        }  # fmt: skip

    def run_one(self, repeat: int, mode: str, inputs: dict, warmup: dict, warm: Counter, reference: Counter,
                conf: dict) -> dict[str, Any]:  # fmt: skip
        """One Task, one shard: warm up, then time the input (module docstring)."""
        task = f"{'local' if mode == 'local' else 'exec'}{repeat}"
        shard = f"{task}-0-{MAX_KEY_GROUPS}"
        startup = self.warm_up(task, shard, mode, warmup, warm, conf)
        say(f"{MODES[mode]}, repeat {repeat}: warm after {startup:.0f}s")
        w = self.timed_window(task, shard, mode, inputs)
        deadline = time.monotonic() + self.args.results_timeout  # the warm-up and the timed input, counted in Python
        while not (check := compare_counts(self.results(task), reference))["exact"] and time.monotonic() < deadline:
            time.sleep(2.0)
        if not check["exact"]:
            say(f"!!! {MODES[mode]}, repeat {repeat}: RESULTS NOT EXACT: {json.dumps(check)}")
        say(
            f"{MODES[mode]}, repeat {repeat}: {w['seconds']:.2f}s, {w['eventsPerSecond']:,} events/s, {w['batches']} "
            f"batches, CPU {w['cpuSeconds']:.1f}s ({w['cpuMicrosPerEvent']:.1f} µs/event; executors "
            f"{w['executorCpuSeconds']:.1f}s), steal {w['stealPercent']}%, exact={check['exact']}"
        )
        self.end_task(task, keep=not check["exact"])
        head = {"repeat": repeat, "mode": mode, "task": task, "shard": shard, "events": self.args.events}
        return head | {"startupSeconds": round(startup, 2), **w, "exact": check["exact"], "check": check}

    def end_task(self, task: str, keep: bool = False) -> None:
        """Delete the Task, wait until its pods (driver, executors) are gone, drop its files (kept when ``keep``)."""
        say(f"deleting Task {task}")
        self.bed.delete_task(task)
        self.task = None
        for part in () if keep else ("journal", "output", "state"):
            shutil.rmtree(self.data / part / task, ignore_errors=True)

    def stop(self) -> None:
        try:
            if self.task and self.bed.operator is not None and self.bed.operator.poll() is None:
                say(f"deleting Task {self.task} (its pods drain and stop)")
                self.bed.run_kubectl("delete", "task", self.task, "--wait=true", "--timeout=300s")
        finally:
            self.bed.stop()


def plot(results: list[dict[str, Any]], summary: dict[str, Any], path: Path, title: str) -> None:
    """Bars per mode (medians), each run as a dot: events/s, and CPU µs per event split into driver and executors."""
    plt = pyplot()
    modes, fig, (a1, a2) = list(summary["modes"]), *plt.subplots(1, 2, figsize=(10, 4.2))
    xs = range(len(modes))

    def per_event(m: str, field: str) -> float:
        return median([r[field] / r["events"] * 1e6 for r in results if r["mode"] == m]) or 0.0

    a1.bar(xs, [summary["modes"][m]["eventsPerSecond"] or 0 for m in modes], width=0.6,
           color=[{"local": "#1f77b4", "executors": "#ff7f0e"}[m] for m in modes])  # fmt: skip
    driver = [per_event(m, "driverCpuSeconds") for m in modes]
    a2.bar(xs, driver, color="#7f7f7f", width=0.6, label="driver pod")
    a2.bar(xs, [per_event(m, "executorCpuSeconds") for m in modes], bottom=driver, color="#ff7f0e", width=0.6,
           label="executor pods")  # fmt: skip
    for ax, field, spec in ((a1, "eventsPerSecond", ",.0f"), (a2, "cpuMicrosPerEvent", ".1f")):
        for x, m in zip(xs, modes, strict=True):
            runs, top = [r[field] for r in results if r["mode"] == m], summary["modes"][m][field] or 0
            ax.plot([x] * len(runs), runs, "o", color="black", ms=4)
            ax.text(x, top, f"{top:{spec}}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [MODES[m] for m in modes], fontsize=8)
    a1.set_ylabel("input events per second (median; dots: runs)")
    a1.set_title("throughput", fontsize=10)
    a2.set_ylabel("CPU µs per input event (median; dots: runs)")
    a2.set_title("CPU cost (all processes of the shard's pods)", fontsize=10)
    a2.legend(fontsize=8)
    cores = (
        f"on {os.cpu_count()} cores the executors share the driver's cores: this shows their overhead, not a speed-up"
    )
    fig.suptitle("\n".join([*textwrap.wrap(title, 110), cores]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_inputs(args: argparse.Namespace, run_dir: Path) -> tuple[int, dict, dict, Counter, Counter]:
    """``(bytes, timed input, warm-up, warm-up per key, all per key)``: inputs as bytes per partition."""
    from scaling import write_input

    def write(name: str, events: int, seed: int) -> tuple[int, Counter, dict[int, bytes]]:
        nbytes, per_key = write_input(run_dir / "input" / name, events, args.keys, PARTITIONS, seed)
        parts = {p: (run_dir / "input" / name / f"p{p}.jsonl").read_bytes() for p in range(PARTITIONS)}
        return nbytes, per_key, {p: d for p, d in parts.items() if d}

    nbytes, per_key, inputs = write("timed", args.events, args.seed)
    _, warm_keys, warmup = write("warmup", args.warmup_events, args.seed + 1)
    say(f"input: {args.events:,} events over {len(per_key):,} keys, {nbytes / 1e6:.1f} MB in {PARTITIONS} partitions")
    return nbytes, inputs, warmup, warm_keys, warm_keys + per_key


def notes(args: argparse.Namespace) -> list[str]:
    return [
        f"Both modes run the same Task but for spec.spark.executors ({args.executors} one-core instances, memory limit "
        f"{args.executor_memory}: {args.executors} task slots against local[2]'s 2) and its service account; a fresh "
        f"Task per run, the modes alternating ({args.repeat} repeats) so that drifts of the machine's load hit both.",
        f"The input (bench/scaling.py's write_input, seed {args.seed}) is appended after a warm-up of "
        f"{args.warmup_events:,} events was consumed; the clock runs from the append to the commit (mtime of "
        "checkpoint/commits/<N>) of the batch that reaches the journal's ends.",
        "CPU = user + system seconds in the window of every process of the shard's pods (each pod's process tree from "
        "its container id; /proc, sampled every second and at both ends by proc_cpu.TreeCpu); the control plane, node "
        "agent and operator are not counted; 'machine busy' is all of this VM's busy time in the window.",
        "'executors' share' = the executor pods' CPU / the shard's; 'tasks finished on executors' counts their "
        "'Executor: Finished task' log lines in the window; 'idle CPU before' is what the shard's pods used in the "
        f"{args.settle:.0f} s before the append. Results exact = final_results equal a plain-Python count.",
        f"CPU steal % = this VM's CPU time the hypervisor gave to other guests (/proc/stat). On {os.cpu_count()} cores "
        "the executors compete with the driver for the same cores: they add task slots only on cores of their own.",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = options(__doc__, seed=5)
    ap.add_argument("--events", type=int, default=300_000, help="timed input events (default 300,000)")
    ap.add_argument("--keys", type=int, default=20_000, help="distinct keys (default 20,000)")
    ap.add_argument("--warmup-events", type=int, default=20_000, help="untimed events first (default 20,000)")
    ap.add_argument("--modes", default="local,executors", help="comma-separated: local, executors (default both)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each mode, interleaved (default 3)")
    ap.add_argument("--executors", type=int, default=2, help="executor pods in the executors mode (default 2)")
    ap.add_argument("--executor-memory", default="1Gi", help="each executor's memory limit (default 1Gi, the least)")
    ap.add_argument("--batches", type=int, default=10, help="micro-batches the timed input is cut into (default 10)")
    ap.add_argument("--shuffle-partitions", default="4", help="spark.sql.shuffle.partitions (default 4)")
    ap.add_argument("--trigger", default="200 milliseconds", help="trigger interval (default 200 milliseconds)")
    ap.add_argument("--settle", type=float, default=5.0, help="idle seconds before the timed input (default 5)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for each wait of a run (default 900)")
    ap.add_argument("--results-timeout", type=float, default=120, help="seconds for exact results (default 120)")
    args = parse(ap, argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: {unknown} unknown; choose from {list(MODES)}")
    if args.executors < 1:
        ap.error("--executors must be at least 1")
    bench = Bench(args)
    bench.run_dir.mkdir(parents=True, exist_ok=True)  # the bed made it
    nbytes, inputs, warmup, warm_keys, reference = write_inputs(args, bench.run_dir)
    conf = {"spark.sql.shuffle.partitions": str(args.shuffle_partitions), "spark.ui.enabled": "false"}
    conf["spark.taskshard.maxBytesPerTrigger"] = str(math.ceil(nbytes / args.batches) + 1024)
    results: list[dict[str, Any]] = []
    with LoadSampler() as load:
        try:
            bench.start()
            for rep in range(1, args.repeat + 1):
                results += [bench.run_one(rep, mode, inputs, warmup, warm_keys, reference, conf) for mode in modes]
        finally:
            bench.stop()
    summary = medians(results, modes)
    title = (f"One shard with {args.executors} executor pods against local mode: {args.events:,} events, {args.keys:,} "
             f"keys, {nbytes / 1e6:.1f} MB in {PARTITIONS} partitions, builtin count, maxBytesPerTrigger = input / "
             f"{args.batches}, {os.cpu_count() or 1} cores")  # fmt: skip
    tables = [
        (title, RUN_COLUMNS, run_rows(results)),
        ("Medians over the repeats, and executors / local", SUMMARY_COLUMNS, summary_rows(summary)),
        ("Each repeat's pair (the two modes ran one after the other)", PAIR_COLUMNS, pair_rows(summary)),
        ("Where the CPU went in the timed window, by pod group and kind", KIND_COLUMNS, kind_rows(results)),
    ]
    plot(results, summary, args.out / f"{NAME}.png", title)
    raw = {"inputBytes": nbytes, "partitions": PARTITIONS, "keys": len(reference), "summary": summary}
    path = publish(NAME, args, argv, title="Executors on Kubernetes against local mode", load=load.summary(),
                   tables=tables, targets=targets(results, summary, args.executors), plots=[f"{NAME}.png"],
                   notes=notes(args), raw=raw | {"results": results, "runDir": str(bench.run_dir)})  # fmt: skip
    print("\nWhat the numbers say:\n" + "\n".join(f"- {line}" for line in summarize(json.loads(path.read_text()))))
    if bad := [f"{MODES[r['mode']]} repeat {r['repeat']}" for r in results if not r["exact"]]:
        say(f"FAILED: results not exact in {', '.join(bad)} (their files are kept under {bench.data})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
