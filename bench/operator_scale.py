"""Operator at scale: time and peak memory to reconcile a Task of ``--shards`` TaskShards with no pods started.

A script, not a test. It starts the local control plane **without** the node agent
(``LocalCluster(node_agent=False)``: etcd, kube-apiserver, controller-manager, scheduler; pods stay Pending), installs
the CRDs and runs the operator as one process (``bench/operator_timed.py``: ``python -m taskshard_operator``'s own
``main()`` with every Kopf handler call and every Kubernetes API call timed; production defaults otherwise, no
``-v``). Then it applies one Task with ``initialShards: --shards`` over ``maxKeyGroups: --max-key-groups`` and
watches (Kubernetes watches, timestamps taken on arrival) until

- every TaskShard of the Task exists and has ``status.phase`` set, and
- the Task's ``status.shards`` reports all of them.

That is "reconciled". It keeps observing for ``--steady`` seconds (the per-shard resync timers keep running)
to measure the operator's steady-state CPU. Memory is the operator process's RSS, sampled every 0.2 s from
``/proc/<pid>/status`` (VmRSS), and its kernel-kept peak (VmHWM). The slowest handler call comes from the
wrapper's timings (wall time of one handler invocation in its worker thread; the object it was for).

Prints tables and writes ``<out>/operator_scale.{json,png}``.

    .venv/bin/python bench/operator_scale.py --shards 500
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    DEFAULT_OUT,
    REPO,
    LoadSampler,
    command_line,
    cpu_seconds,
    kubectl_retry,
    machine,
    print_table,
    pyplot,
    say,
    status_kib,
    wait_served,
    write_result,
)

from taskshard_operator.live import LIVE_INTERVAL_SECONDS  # noqa: E402

NAMESPACE = "bench-operator"
TASK = "wide"
GROUP, VERSION = "taskshard.io", "v1alpha1"


class Observer:
    """Kubernetes watches on TaskShards, Pods and the Task, recording when each thing was first seen."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.lock = threading.Lock()
        self.shard_seen: dict[str, float] = {}
        self.shard_phase: dict[str, float] = {}
        self.pod_seen: dict[str, float] = {}
        self.task_shards: list[tuple[float, int]] = []
        self.task_status: dict[str, Any] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(self._shards,), daemon=True),
            threading.Thread(target=self._loop, args=(self._pods,), daemon=True),
            threading.Thread(target=self._loop, args=(self._task,), daemon=True),
        ]

    def start(self) -> Observer:
        for t in self.threads:
            t.start()
        return self

    def _loop(self, fn: Any) -> None:
        while not self.stop.is_set():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a broken watch is restarted
                self.errors.append(repr(e))
                time.sleep(0.5)

    def _stream(self, list_fn: Any, *args: Any) -> Any:
        from kubernetes import watch

        w = watch.Watch()
        for event in w.stream(list_fn, *args, timeout_seconds=60):
            if self.stop.is_set():
                w.stop()
                return
            yield event["type"], event["object"]

    def _shards(self) -> None:
        for _kind, obj in self._stream(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, "taskshards"
        ):
            now = time.time()
            name = obj["metadata"]["name"]
            with self.lock:
                self.shard_seen.setdefault(name, now)
                if (obj.get("status") or {}).get("phase"):
                    self.shard_phase.setdefault(name, now)

    def _pods(self) -> None:
        for _kind, obj in self._stream(self.core.list_namespaced_pod, NAMESPACE):
            with self.lock:
                self.pod_seen.setdefault(obj.metadata.name, time.time())

    def _task(self) -> None:
        for _kind, obj in self._stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, "tasks"):
            status = obj.get("status") or {}
            with self.lock:
                self.task_status = status
                if status.get("shards") is not None:
                    self.task_shards.append((time.time(), int(status["shards"])))

    def counts(self) -> tuple[int, int, int, int]:
        with self.lock:
            shards = self.task_status.get("shards") or 0
            return len(self.shard_seen), len(self.shard_phase), len(self.pod_seen), int(shards)


class BusyShards:
    """Every driver pod made to look like a busy running shard, without Spark: each pod's status is patched to
    Running with pod IP 127.0.0.1 (the status subresource; no node agent runs), and one HTTP server on
    127.0.0.1:9108 answers every scrape with the metrics of a shard that committed a new batch since the last
    one. Every shard's ``status.live`` therefore changes at every scrape: the worst case for status writes."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.scrapes = 0
        self.server: Any = None

    def start(self) -> None:
        import http.server

        from spark_runtime.live import Metric

        busy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                busy.scrapes += 1
                n = busy.scrapes
                body = (
                    f'{Metric.LAST_BATCH}{{task="{TASK}",shard="x"}} {n}\n'
                    f'{Metric.LAST_BATCH_TIMESTAMP}{{task="{TASK}",shard="x"}} {time.time():.3f}\n'
                    f'{Metric.ROWS_PER_SECOND}{{task="{TASK}",shard="x"}} {100 + n % 50}\n'
                    f'{Metric.LAG}{{task="{TASK}",shard="x",unit="records"}} {n % 7}\n'
                    f'{Metric.EMITTING}{{task="{TASK}",shard="x"}} 1\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 9108), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def run_pods(self) -> int:
        """Patch every driver pod's status to Running on 127.0.0.1; returns how many."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        pods = self.core.list_namespaced_pod(NAMESPACE).items
        for pod in pods:
            status = {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "podIPs": [{"ip": "127.0.0.1"}],
                "containerStatuses": [
                    {
                        "name": "driver",
                        "image": "bench",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now}},
                    }
                ],
            }
            self.core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, {"status": status})
        return len(pods)

    def wait_all_live(self, timeout: float) -> float:
        """Seconds until every TaskShard of the Task has phase Running and a ``status.live``."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.core.api_client)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "taskshards")["items"]
            statuses = [i.get("status") or {} for i in items]
            if items and all(s.get("phase") == "Running" and s.get("live") for s in statuses):
                return time.monotonic() - t0
            time.sleep(2)
        raise RuntimeError(f"not every TaskShard showed Running with status.live within {timeout:.0f}s")

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            rss = status_kib(self.pid, "VmRSS")
            if rss is None:
                return
            self.samples.append((time.time(), rss))


def task_manifest(shards: int, max_key_groups: int, data: Path) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Task",
        "metadata": {"name": TASK, "namespace": NAMESPACE},
        "spec": {
            "maxKeyGroups": max_key_groups,
            "initialShards": shards,
            "keyField": "key",
            "processor": {"builtin": "count"},
            "source": {"journal": {"path": f"/data/journal/{TASK}", "partitions": 4}},
            "sink": {"directory": {"path": f"/data/output/{TASK}", "format": "jsonl"}},
            "storage": {"path": "/data/state", "volume": {"hostPath": str(data), "mountPath": "/data"}},
            "spark": {"image": "taskshard/shard:0.1.0", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
    }


def read_timings(path: Path, proc: subprocess.Popen | None) -> dict[str, Any]:
    """The wrapper's latest timings; with a live ``proc``, ask it for a fresh dump first (SIGUSR1)."""
    if proc is not None and proc.poll() is None:
        asked = time.time()
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                data = json.loads(path.read_text())
                if data["written"] >= asked:
                    return data
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
    return json.loads(path.read_text())


SETTLE_SECONDS = 3.0
LIVE_SECONDS = LIVE_INTERVAL_SECONDS
"""The operator's live-status scrape interval (its production default, which the benchmark runs with)."""
"""The operator is idle once no reconcile pass ran for this long (the steady-state window starts then)."""


def settle(timings_path: Path, proc: subprocess.Popen, timeout: float) -> float:
    """Wait until no reconcile pass has run for :data:`SETTLE_SECONDS` (the passes queued while reconciling are
    done); returns the time it settled (or the timeout's end)."""

    def passes() -> int:
        handlers = read_timings(timings_path, proc)["handlers"]
        return sum(h["calls"] for k, h in handlers.items() if k.startswith("pass:"))

    deadline = time.time() + timeout
    last, since = passes(), time.time()
    while time.time() < deadline:
        time.sleep(0.5)
        now = passes()
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= SETTLE_SECONDS:
            return since
    return time.time()


def plot(obs: Observer, rss: list[tuple[float, int]], t0: float, t_done: float | None, path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))

    def cumulative(times: dict[str, float], label: str, style: str) -> None:
        ts = sorted(t - t0 for t in times.values())
        if ts:
            ax.step(ts, range(1, len(ts) + 1), where="post", ls=style, label=label)

    cumulative(obs.shard_seen, "TaskShards created", "-")
    cumulative(obs.shard_phase, "TaskShards with status.phase", "-")
    cumulative(obs.pod_seen, "driver pods created (Pending)", ":")
    if obs.task_shards:
        ax.step(
            [t - t0 for t, _ in obs.task_shards],
            [n for _, n in obs.task_shards],
            where="post",
            ls="--",
            label="Task status.shards",
        )
    if t_done:
        ax.axvline(t_done - t0, color="black", lw=0.8)
        ax.text(t_done - t0, 5, f" reconciled: {t_done - t0:.1f}s", fontsize=8)
    ax.set_xlabel("seconds since kubectl apply")
    ax.set_ylabel("objects")
    ax.legend(loc="center right", fontsize=8)
    ax2 = ax.twinx()
    if rss:
        ax2.plot([t - t0 for t, _ in rss], [kib / 1024 for _, kib in rss], color="#d62728", lw=1, label="operator RSS")
    ax2.set_ylabel("operator RSS (MiB)", color="#d62728")
    ax2.set_ylim(0, max([kib / 1024 for _, kib in rss] or [1]) * 1.2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


TARGETS = {"reconciled": 30.0, "slowest": 1.0, "requests": 1.0, "cpu": 3.0, "rss": 150.0}
"""Issue 20's targets for 500 TaskShards (seconds, seconds, requests/s, % of a core, MiB)."""


def targets(
    result: dict[str, Any], shards: int, slowest: tuple, steady_rate: float, steady_calls: dict[str, int]
) -> list[dict[str, Any]]:
    """Issue 20's targets, each with what the numbers are made of when missed."""
    name = f"{shards} TaskShards reconciled"
    done = result["reconciledSeconds"]
    busiest = ", ".join(f"{k} {v}" for k, v in sorted(steady_calls.items(), key=lambda kv: -kv[1])[:4] if v)
    return [
        {
            "name": f"{name}: apply -> all reconciled",
            "target": f"<= {TARGETS['reconciled']:.0f} s",
            "value": f"{done:.1f} s" if done is not None else "not reconciled",
            "met": done is not None and done <= TARGETS["reconciled"],
            "why": f"all created {result['allShardsCreatedSeconds']} s, all pods {result['allPodsSeconds']} s, "
            f"all phases {result['allPhasesSeconds']} s; operator CPU {result['cpuPercentReconcile']} % meanwhile",
        },
        {
            "name": f"{name}: slowest handler call or pass",
            "target": f"<= {TARGETS['slowest']:.0f} s",
            "value": "{:.3f} s ({}, {}{})".format(*slowest),
            "met": slowest[0] <= TARGETS["slowest"],
            "why": "the slowest call's handler and object are named in the value",
        },
        {
            "name": f"{name}: API requests/s when idle",
            "target": f"<= {TARGETS['requests']:.0f}/s",
            "value": f"{steady_rate:.2f}/s",
            "met": steady_rate <= TARGETS["requests"],
            "why": f"calls in the steady window: {busiest or 'none'}",
        },
        {
            "name": f"{name}: operator CPU when idle",
            "target": f"<= {TARGETS['cpu']:.0f} % of a core",
            "value": f"{result['cpuPercentSteady']} %",
            "met": result["cpuPercentSteady"] <= TARGETS["cpu"],
            "why": "Kopf's watch streams and the idle work-queue threads",
        },
        {
            "name": f"{name}: status writes per shard per 10 s, every shard busy (live status)",
            "target": "<= 1",
            "value": f"{result['busy']['writesPerShardPer10s']:.2f}",
            "met": result["busy"]["writesPerShardPer10s"] <= 1.0,
            "why": f"{result['busy']['statusWrites']} status writes for {result['busy']['pods']} shards in "
            f"{result['busy']['seconds']} s ({result['busy']['scrapes']} scrapes, each showing a new batch)",
        },
        {
            "name": f"{name}: operator peak RSS",
            "target": f"<= {TARGETS['rss']:.0f} MiB",
            "value": f"{result['peakRssMiB']} MiB",
            "met": result["peakRssMiB"] <= TARGETS["rss"],
            "why": f"idle before the Task {result['rssIdleMiB']} MiB; the rest is Kopf's per-object state and the "
            "cache",
        },
    ]


def busy_steady_state(cluster: Any, timings_path: Path, proc: subprocess.Popen, args: Any) -> dict[str, Any]:
    """Status writes while every shard is busy (:class:`BusyShards`): the operator scrapes every driver every
    ``LIVE_SECONDS`` and writes ``status.live`` only when it changed, so at most one write per shard per interval.
    Measured over ``--busy`` seconds once every shard shows Running with a ``status.live``, one interval later."""
    busy = BusyShards(cluster.kubeconfig)
    try:
        busy.start()
        say("busy shards: every driver pod Running on 127.0.0.1, every scrape sees a new batch")
        pods = busy.run_pods()
        # Wait until every shard shows Running with a status.live (the pods' statuses mirrored: phase, Ready,
        # the first live write), then one more interval, so that only the live writes are counted.
        waited = busy.wait_all_live(timeout=300)
        say(f"every shard Running with status.live after {waited:.0f}s; counting status writes for {args.busy:.0f}s")
        time.sleep(LIVE_SECONDS)
        before = read_timings(timings_path, proc)["api"]
        scrapes0, t1 = busy.scrapes, time.time()
        time.sleep(args.busy)
        after = read_timings(timings_path, proc)["api"]
        seconds = time.time() - t1
    finally:
        busy.stop()
    calls = {n: a["calls"] - before.get(n, {}).get("calls", 0) for n, a in after.items()}
    errors = {
        n: {e: k - (before.get(n, {}).get("errors") or {}).get(e, 0) for e, k in (a.get("errors") or {}).items()}
        for n, a in after.items()
    }
    writes = calls.get("patch_custom_status", 0)
    return {
        "pods": pods,
        "seconds": round(seconds, 1),
        "scrapes": busy.scrapes - scrapes0,
        "statusWrites": writes,
        "writesPerShardPer10s": round(10 * writes / max(1, pods) / max(1e-9, seconds), 3),
        "apiCalls": calls,
        "apiErrors": {n: e for n, e in errors.items() if any(e.values())},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=500, help="initialShards of the Task (default 500)")
    ap.add_argument("--max-key-groups", type=int, default=512, help="maxKeyGroups (default 512)")
    ap.add_argument("--steady", type=float, default=30.0, help="seconds to observe after reconciling (default 30)")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds (default 900)")
    ap.add_argument(
        "--busy", type=float, default=40.0, help="seconds to count status writes with every shard busy (default 40)"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    args.out = args.out.resolve()  # paths go into configs and hostPath volumes
    if args.shards > args.max_key_groups:
        ap.error("--shards must be <= --max-key-groups")

    from localkube.binaries import ensure_binaries
    from localkube.cluster import LocalCluster

    run_dir = args.out / "work" / "operator_scale" / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True)
    timings_path = run_dir / "operator-timings.json"
    op_log = run_dir / "operator.log"
    cluster = LocalCluster(run_dir / "cluster", binaries=ensure_binaries(), node_agent=False)
    proc: subprocess.Popen | None = None
    obs: Observer | None = None
    sampler: RssSampler | None = None
    result: dict[str, Any] = {}
    with LoadSampler() as load:
        say("starting the local control plane without the node agent")
        t = time.perf_counter()
        cluster.start()
        say(f"control plane up in {time.perf_counter() - t:.1f}s; KUBECONFIG={cluster.kubeconfig}")
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            cluster.kubectl(
                "wait", "--for=condition=Established", "crd/tasks.taskshard.io", "crd/taskshards.taskshard.io"
            )
            cluster.kubectl("create", "namespace", NAMESPACE)
            wait_served(cluster, NAMESPACE, "tasks.taskshard.io", "taskshards.taskshard.io")
            env = cluster.env()
            env["TASKSHARD_BENCH_TIMINGS"] = str(timings_path)
            log = open(op_log, "wb")  # noqa: SIM115 - owned by the child
            cmd = [sys.executable, str(REPO / "bench" / "operator_timed.py"), "--namespace", NAMESPACE]
            cmd += ["--standalone", "--liveness", ""]
            proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            deadline = time.monotonic() + 120
            while True:  # ready: the startup activity ran (the wrapper timed it)
                if proc.poll() is not None:
                    raise RuntimeError(f"the operator exited with {proc.returncode}: {op_log.read_text()[-3000:]}")
                try:
                    if "operator_startup" in json.loads(timings_path.read_text())["handlers"]:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the operator did not start in 120 s: {op_log.read_text()[-3000:]}")
                time.sleep(0.2)
            time.sleep(2.0)  # its watches are established
            obs = Observer(cluster.kubeconfig).start()
            sampler = RssSampler(proc.pid)
            sampler.start()
            time.sleep(1.0)
            rss_idle = status_kib(proc.pid, "VmRSS")
            cpu_idle = cpu_seconds([proc.pid])
            import yaml

            manifest = yaml.safe_dump(task_manifest(args.shards, args.max_key_groups, run_dir / "data"))
            say(f"applying Task {TASK}: initialShards {args.shards}, maxKeyGroups {args.max_key_groups}")
            t0 = time.time()
            kubectl_retry(cluster, "apply", "-f", "-", input=manifest)
            t_done = None
            last = None
            while time.time() - t0 < args.timeout:
                counts = obs.counts()
                if counts != last:
                    last = counts
                if counts[0] >= args.shards and counts[1] >= args.shards and counts[3] >= args.shards:
                    t_done = time.time()
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"the operator exited with {proc.returncode}: {op_log.read_text()[-3000:]}")
                time.sleep(0.05)
            if t_done is None:
                say(f"NOT reconciled within {args.timeout:.0f}s: created/phase/pods/task = {obs.counts()}")
            else:
                # The completion time is the later of the two events as observed by the watches.
                with obs.lock:
                    t_done = max(
                        max(obs.shard_phase.values()),
                        next(t for t, n in obs.task_shards if n >= args.shards),
                    )
                say(f"reconciled {args.shards} TaskShards in {t_done - t0:.1f}s")
            hwm_done = status_kib(proc.pid, "VmHWM")
            t_settled = settle(timings_path, proc, timeout=120.0)
            say(f"settled (no pass for {SETTLE_SECONDS:.0f}s) {t_settled - t0:.1f}s after the apply")
            cpu_done = cpu_seconds([proc.pid])
            timings_done = read_timings(timings_path, proc)
            t_steady = time.time()
            say(f"observing the steady state for {args.steady:.0f}s")
            time.sleep(args.steady)
            cpu_end = cpu_seconds([proc.pid])
            t_end = time.time()
            hwm = status_kib(proc.pid, "VmHWM")
            timings = read_timings(timings_path, proc)
            counts = obs.counts()
            live = busy_steady_state(cluster, timings_path, proc, args)
            result = {
                "t0": t0,
                "reconciledSeconds": round(t_done - t0, 3) if t_done else None,
                "settledSeconds": round(t_settled - t0, 3),
                "firstShardSeconds": round(min(obs.shard_seen.values()) - t0, 3) if obs.shard_seen else None,
                "allShardsCreatedSeconds": round(max(obs.shard_seen.values()) - t0, 3) if obs.shard_seen else None,
                "allPhasesSeconds": round(max(obs.shard_phase.values()) - t0, 3) if obs.shard_phase else None,
                "allPodsSeconds": round(max(obs.pod_seen.values()) - t0, 3) if obs.pod_seen else None,
                "taskShardsReported": counts[3],
                "shardsCreated": counts[0],
                "shardsWithPhase": counts[1],
                "podsCreated": counts[2],
                "rssIdleMiB": round((rss_idle or 0) / 1024, 1),
                "peakRssAtReconciledMiB": round((hwm_done or 0) / 1024, 1),
                "peakRssMiB": round((hwm or 0) / 1024, 1),
                "cpuSecondsReconcile": round(cpu_done - cpu_idle, 2),
                "cpuPercentReconcile": round(100 * (cpu_done - cpu_idle) / max(1e-9, (t_done or t_end) - t0), 1),
                "cpuPercentSteady": round(100 * (cpu_end - cpu_done) / max(1e-9, t_end - t_steady), 1),
                "steadySeconds": round(t_end - t_steady, 1),
                "timingsAtReconciled": timings_done,
                "timings": timings,
                "rss": [(round(t - t0, 2), kib) for t, kib in sampler.samples],
                "watchErrors": obs.errors[:10],
                "busy": live,
            }
            plot(
                obs,
                sampler.samples,
                t0,
                t_done,
                args.out / "operator_scale.png",
                f"{args.shards} TaskShards, no pods started (local control plane, no node); operator process",
            )
        finally:
            if obs is not None:
                obs.stop.set()
            if sampler is not None:
                sampler.halt.set()
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=30)
            cluster.stop()

    hs = result["timings"]["handlers"]
    inflight = result["timings"].get("inflight") or []
    longest_inflight: dict[str, dict[str, Any]] = {}
    for call in inflight:
        longest_inflight.setdefault(call["handler"], call)
    calls = [(h["max"], hid, (h["slowest"] or [{"object": "-"}])[0]["object"], "") for hid, h in hs.items()]
    calls += [(c["seconds"], c["handler"], c["object"], ", still running") for c in inflight]
    slow_s, slow_id, slow_obj, slow_note = max(calls)
    kopf_calls = [c for c in calls if not c[1].startswith("pass:")] or [(0.0, "-", "-", "")]
    pass_calls = [c for c in calls if c[1].startswith("pass:")] or [(0.0, "-", "-", "")]
    api = result["timings"]["api"]
    api_done = result["timingsAtReconciled"]["api"]
    steady_calls = {n: a["calls"] - api_done.get(n, {}).get("calls", 0) for n, a in api.items()}
    steady_rate = sum(steady_calls.values()) / max(1e-9, result["steadySeconds"])
    status_writes = steady_calls.get("patch_custom_status", 0)
    writes_per_shard_10s = 10 * status_writes / max(1, args.shards) / max(1e-9, result["steadySeconds"])
    columns = ["measure", "value"]
    table = [
        ["TaskShards (maxKeyGroups)", f"{args.shards} ({args.max_key_groups})"],
        ["apply -> first TaskShard created s", result["firstShardSeconds"]],
        ["apply -> all TaskShards created s", result["allShardsCreatedSeconds"]],
        ["apply -> all driver pods created (Pending) s", result["allPodsSeconds"]],
        ["apply -> all TaskShards have status.phase s", result["allPhasesSeconds"]],
        ["apply -> reconciled (all phases + Task status.shards) s", result["reconciledSeconds"]],
        ["apply -> settled (the last queued pass done) s", result["settledSeconds"]],
        ["operator RSS idle MiB", result["rssIdleMiB"]],
        ["operator peak RSS (VmHWM) until reconciled MiB", result["peakRssAtReconciledMiB"]],
        [f"operator peak RSS (VmHWM) incl. {result['steadySeconds']:.0f}s steady state MiB", result["peakRssMiB"]],
        ["operator CPU while reconciling (% of one core)", result["cpuPercentReconcile"]],
        ["operator CPU in steady state (% of one core)", result["cpuPercentSteady"]],
        ["slowest Kopf handler call s", "{:.3f} ({}, {}{})".format(*max(kopf_calls))],
        ["slowest reconcile pass s", "{:.3f} ({}, {}{})".format(*max(pass_calls))],
        ["Kubernetes API requests/s in steady state", round(steady_rate, 2)],
        ["status writes per shard per 10 s in steady state", round(writes_per_shard_10s, 3)],
        [
            f"status writes per shard per 10 s with every shard busy ({result['busy']['seconds']:.0f}s, "
            f"{result['busy']['scrapes']} scrapes)",
            result["busy"]["writesPerShardPer10s"],
        ],
    ]
    goals = targets(result, args.shards, (slow_s, slow_id, slow_obj, slow_note), steady_rate, steady_calls)
    for g in goals:
        say(f"target {g['name']}: {g['value']} ({g['target']}): {'met' if g['met'] else 'MISSED'}")
    handler_cols = [
        "handler",
        "calls done",
        "total s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "slowest object",
        "in flight at end",
    ]
    handler_rows = [
        [
            hid,
            h["calls"],
            h["seconds"],
            round(h["p50"] * 1000, 1),
            round(h["p99"] * 1000, 1),
            round(h["max"] * 1000, 1),
            h["slowest"][0]["object"] if h["slowest"] else "-",
            f"{longest_inflight[hid]['seconds']:.1f}s ({longest_inflight[hid]['object']})"
            if hid in longest_inflight
            else "-",
        ]
        for hid, h in sorted(hs.items(), key=lambda kv: -kv[1]["max"])
    ]
    for hid, call in longest_inflight.items():
        if hid not in hs:
            handler_rows.insert(0, [hid, 0, None, None, None, None, "-", f"{call['seconds']:.1f}s ({call['object']})"])
    api_cols = ["Kube method", "calls until reconciled", "calls in steady state", "per second (steady)", "max ms"]
    api_rows = [
        [
            name,
            api_done.get(name, {}).get("calls", 0),
            a["calls"] - api_done.get(name, {}).get("calls", 0),
            round((a["calls"] - api_done.get(name, {}).get("calls", 0)) / max(1e-9, result["steadySeconds"]), 1),
            round(a["max"] * 1000, 1),
        ]
        for name, a in sorted(api.items(), key=lambda kv: -kv[1]["calls"])
    ]
    summary = load.summary()
    title = f"Operator: a Task of {args.shards} TaskShards, pods not started"
    print_table(title, columns, table, summary)
    print_table("Handler calls (wall time per call, in the worker thread)", handler_cols, handler_rows)
    print_table("Kubernetes API calls by the operator", api_cols, api_rows)
    notes = [
        "Reconciled = every TaskShard has status.phase (Pending: its pod is created but no node runs it) and the "
        "Task's status.shards reports all of them; times are when the benchmark's watches saw it.",
        "Memory: VmRSS of the operator process sampled every 0.2 s, and VmHWM (the kernel's peak RSS).",
        "Handler timings: bench/operator_timed.py wraps each handler function in Kopf's registry (the handlers "
        "only enqueue a key) and every reconcile pass the work queue runs (pass:task, pass:shard: observe from the "
        "cache, decide, act, write status once). A call's time is its wall time; queueing is not included. A call "
        "still running when the benchmark ends is listed as in flight, with its age.",
        "Steady state: it starts once the operator settled (no reconcile pass for 3 s: the passes queued while "
        "reconciling, e.g. each shard's second status write as its pod shows Pending, are done). Watch events "
        "drive the passes; the safety-net resync gives every object a pass every 300 s (rarely inside a short "
        "window). The CPU and API rates then show what idle shards cost.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(
        args.out,
        "operator_scale",
        {
            "title": "Operator: reconciling many TaskShards",
            "command": command_line(argv),
            "parameters": vars(args) | {"out": str(args.out)},
            "machine": machine(),
            "load": summary,
            "tables": [
                {"title": title, "columns": columns, "rows": table},
                {"title": "Handler calls", "columns": handler_cols, "rows": handler_rows},
                {"title": "Kubernetes API calls by the operator", "columns": api_cols, "rows": api_rows},
            ],
            "targets": goals,
            "plots": ["operator_scale.png"],
            "notes": notes,
            "raw": {k: v for k, v in result.items()} | {"runDir": str(run_dir)},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
