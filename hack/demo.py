"""The main job (``make demo``): a Task on a cluster, split twice while events keep arriving, results checked.

Steps, each printed as it happens:
1. A cluster: the local control plane (etcd, kube-apiserver, controller-manager, scheduler and the local node
   agent, all on 127.0.0.1) unless ``KUBECONFIG`` is set, in which case that cluster is used as it is.
2. The CRDs from ``crds/`` and the operator (``python -m taskshard_operator``, a local process watching the demo
   namespace). Steps 1 and 2 are ``hack/operator_bed.py``'s ``OperatorBed``, the benchmarks' bootstrap too.
3. A Task counting events per key over 128 key groups, one initial shard, reading a 2-partition journal in
   ``<run dir>/data`` (mounted into the shard pods as ``/data`` through a hostPath volume).
4. A producer appends events all along. Once the shard holds state (a few committed batches) it is split at its
   midpoint, then its left child is split again the same way: the edit a user makes with
   ``kubectl edit taskshard NAME`` (``spec.split.requested: true``). The parent keeps processing while its
   children catch up; a split is done when both children are Ready, i.e. emitting. For each split the demo
   prints how long the split range went without output (the processing gap: the parent's last commit to the
   later child's first emitting commit) and how many batches the parent committed meanwhile.
5. The producer stops; once the shards have caught up, every key's count is compared with a plain-Python count
   of the journal: nothing lost, nothing counted twice. Shard tables before and after are printed.

All along, the shards' live status (RATE, LAG, LAST BATCH: what the operator reads from each driver's metrics
endpoint, here every 2 s) is printed with every phase change and in the tables, and at the end ``live.png`` in
the run directory plots rate and lag per shard over the demo's time line with the split moments marked
(``hack/demo_live.py``).

On an existing cluster the shard pods must be able to run the image named by ``TASKSHARD_DEMO_IMAGE`` and to
mount the run directory's ``data`` folder at the same host path (a single-node cluster on this machine).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from demo_live import LiveView
from operator_bed import OperatorBed

from spark_runtime.produce import append_events
from spark_runtime.results import final_results

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "taskshard-demo"
TASK = "clicks"
KEYS = 200
PARTITIONS = 2
PHASE_TIMEOUT = 600


def say(message: str) -> None:
    print(f"\n==> [{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Demo:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.data = run_dir / "data"
        self.journal = self.data / "journal" / TASK
        # status.live every 2 s (the operator's default is 10)
        self.bed = OperatorBed(
            run_dir, NAMESPACE, kubeconfig=os.environ.get("KUBECONFIG"), operator_args=("--live-status-seconds", "2")
        )
        self.produced = 0
        self._stop_producer = threading.Event()
        self.live = LiveView(lambda: list(self.shards().values()))

    # ----------------------------------------------------------------- plumbing
    def shards(self) -> dict[str, dict]:
        return {i["metadata"]["name"]: i for i in self.bed.get_json("taskshards")["items"]}

    def wait_phases(self, expected: dict[str, str]) -> None:
        last: list[dict | None] = [None]

        def reached() -> bool:
            phases = {n: (s.get("status") or {}).get("phase") for n, s in self.shards().items()}
            if phases != last[0]:
                print("    phases: " + ", ".join(f"{n}={p}" for n, p in sorted(phases.items())), flush=True)
                print(f"    live: {self.live.line()}", flush=True)
                last[0] = phases
            return all(phases.get(n) == p for n, p in expected.items())

        self.bed.wait(f"the shards reaching {expected}", reached, PHASE_TIMEOUT, interval=2)

    def table(self, title: str) -> None:
        say(title)
        print(self.bed.kubectl("get", "taskshards", "-o", "wide"), flush=True)

    # ----------------------------------------------------------------- steps
    def start(self) -> None:
        """Steps 1 and 2: the cluster, the CRDs and the operator (``hack/operator_bed.py``)."""
        if self.bed.cluster is None:
            say(f"using the existing cluster from KUBECONFIG={self.bed.kubeconfig}")
        else:
            say("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, node agent)")
        self.bed.start()
        if self.bed.cluster is not None:
            print(f"    KUBECONFIG={self.bed.kubeconfig}\n    component logs: {self.bed.cluster.log_dir}", flush=True)
        say("the CRDs installed and the operator started")
        assert self.bed.operator is not None
        print(f"    operator pid {self.bed.operator.pid}, log {self.bed.operator_log}", flush=True)

    def stop(self) -> None:
        if self.bed.cluster is not None:
            say("stopping the operator and the local control plane")
        self.bed.stop()

    def manifest(self) -> dict[str, Any]:
        """The Task of step 3."""
        image = os.environ.get("TASKSHARD_DEMO_IMAGE", "taskshard/shard:0.1.0")
        spec = {"maxKeyGroups": 128, "initialShards": 1, "keyField": "key", "processor": {"builtin": "count"}}
        spec["source"] = {"journal": {"path": f"/data/journal/{TASK}", "partitions": PARTITIONS}}
        spec["sink"] = {"directory": {"path": f"/data/output/{TASK}", "format": "jsonl"}}
        spec["storage"] = {"path": "/data/state", "volume": {"hostPath": str(self.data), "mountPath": "/data"}}
        conf = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
        spec["spark"] = {"image": image, "conf": conf, "triggerInterval": "1 second"}
        return {"apiVersion": "taskshard.io/v1alpha1", "kind": "Task", "metadata": {"name": TASK}, "spec": spec}

    def apply_task(self, what: str = "count per key, 128 key groups, 1 initial shard") -> None:
        say(f"applying Task {TASK}: {what}")
        self.journal.mkdir(parents=True, exist_ok=True)
        manifest = yaml.safe_dump(self.manifest(), sort_keys=False, default_flow_style=None, width=120)
        print(textwrap.indent(manifest.strip(), "    "), flush=True)
        self.bed.kubectl("apply", "-f", "-", input=manifest)

    def produce(self) -> None:
        """Append 40 events every half second until stopped (keys k0..k199)."""
        while not self._stop_producer.is_set():
            events = [{"key": f"k{(self.produced + i) * 7919 % KEYS}", "n": self.produced + i} for i in range(40)]
            append_events(self.journal, PARTITIONS, events)
            self.produced += len(events)
            self._stop_producer.wait(0.5)

    def shard_dir(self, shard: str) -> Path:
        return self.data / "state" / TASK / "shards" / shard

    def committed(self, shard: str) -> dict[int, float]:
        """Committed batch ids of ``shard`` and when each was committed (the commit log's mtimes)."""
        commits = self.shard_dir(shard) / "checkpoint" / "commits"
        return (
            {int(f.name): f.stat().st_mtime for f in commits.glob("*") if f.name.isdigit()} if commits.is_dir() else {}
        )

    def wait_for_state(self, shard: str, batches: int = 3) -> None:
        """Wait until ``shard`` has committed ``batches`` batches: a split then hands over real state."""
        self.bed.wait(
            f"{shard} committing {batches} batches", lambda: len(self.committed(shard)) >= batches, PHASE_TIMEOUT
        )

    def ready(self, shard: str) -> bool:
        conditions = ((self.shards().get(shard) or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def first_emitting_commit(self, shard: str) -> float | None:
        """When ``shard`` committed the first batch that wrote results (a catching-up child's earlier batches
        write nothing)."""
        out = self.data / "output" / TASK / f"shard={shard}"
        ids = sorted(int(f.name.split("-")[1].split(".")[0]) for f in out.glob("**/batch-*.jsonl"))
        return self.committed(shard).get(ids[0]) if ids else None

    def split(self, shard: str) -> tuple[str, str]:
        self.wait_for_state(shard)
        spec = self.shards()[shard]["spec"]["keyGroups"]
        mid = spec["start"] + (spec["end"] - spec["start"]) // 2
        held = len(self.committed(shard))
        say(
            f"splitting {shard} [{spec['start']}, {spec['end']}) at its midpoint {mid} after {held} committed "
            f"batches (kubectl edit taskshard {shard}: spec.split.requested: true); {self.produced} events so far"
        )
        requested = time.time()
        self.live.mark(f"split {shard}")
        print(f"    live: {self.live.line()}", flush=True)
        self.bed.kubectl("patch", "taskshard", shard, "--type", "merge", "-p", '{"spec":{"split":{"requested":true}}}')
        left, right = f"{TASK}-{spec['start']}-{mid}", f"{TASK}-{mid}-{spec['end']}"
        started = time.monotonic()
        self.wait_phases({shard: "Split", left: "Running", right: "Running"})
        self.bed.wait(
            f"{left} and {right} Ready (emitting)", lambda: self.ready(left) and self.ready(right), PHASE_TIMEOUT
        )
        self.live.mark(f"{left}, {right} ready")
        print(
            f"    split done in {time.monotonic() - started:.0f}s: {left} and {right} are Ready (emitting)", flush=True
        )
        self.report_gap(shard, (left, right), requested)
        time.sleep(4)  # two scrapes: the children's RATE and LAG are in their status
        self.table("shards right after the split (RATE, LAG, LAST BATCH: status.live, scraped from each driver)")
        return left, right

    def report_gap(self, parent: str, children: tuple[str, str], requested: float) -> None:
        summary = json.loads((self.shard_dir(parent) / "drained.json").read_text())
        parent_commits = self.committed(parent)
        last = parent_commits.get(summary["batchId"])
        deadline = time.monotonic() + 120  # Ready comes as a child reaches the final positions; its first emitting
        firsts = [self.first_emitting_commit(c) for c in children]  # batch commits a trigger or two later
        while None in firsts and time.monotonic() < deadline:
            time.sleep(0.5)
            firsts = [self.first_emitting_commit(c) for c in children]
        during = sum(1 for t in parent_commits.values() if requested <= t <= (last or requested))
        if last is None or None in firsts:
            print(f"    processing gap: not measurable (commit times missing: {last}, {firsts})", flush=True)
            return
        gap = max(firsts) - last  # type: ignore[type-var]
        print(
            f"    the parent committed {during} batches while its children caught up ({summary.get('handover')} "
            f"hand-over at batch {summary['batchId']}); the split range went {gap:.1f}s without output "
            "(parent's last commit -> the later child's first emitting commit)",
            flush=True,
        )

    def reference(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for part in sorted(self.journal.glob("p*.jsonl")):
            for line in part.read_text().splitlines():
                if line.strip():
                    counts[str(json.loads(line)["key"])] += 1
        return dict(counts)

    def results(self) -> dict[str, int]:
        found = final_results(self.data / "output" / TASK, self.data / "state", TASK)
        return {str(k): int(v) for k, v in found.items()}

    def check_results(self) -> bool:
        expected = self.reference()
        say(f"producer stopped after {self.produced} events; waiting for the shards to catch up")
        deadline = time.monotonic() + 300
        actual: dict[str, int] = {}
        while time.monotonic() < deadline:
            actual = self.results()
            if actual == expected:
                break
            time.sleep(2)
        missing = {k: v - actual.get(k, 0) for k, v in expected.items() if actual.get(k, 0) < v}
        extra = {k: actual[k] - expected.get(k, 0) for k in actual if actual[k] > expected.get(k, 0)}
        say("per-key result check against a plain-Python count of the journal")
        print(
            f"    keys: {len(expected)} expected, {len(actual)} reported; events: {sum(expected.values())} in the "
            f"journal, {sum(actual.values())} counted",
            flush=True,
        )
        print(f"    keys short (lost): {len(missing)}; keys over (double-counted): {len(extra)}", flush=True)
        ok = not missing and not extra
        print(
            "    RESULT: exact"
            if ok
            else f"    RESULT: MISMATCH short={dict(list(missing.items())[:5])} over={dict(list(extra.items())[:5])}",
            flush=True,
        )
        return ok

    def run(self) -> int:
        producer = threading.Thread(target=self.produce, daemon=True)
        try:
            self.start()
            self.apply_task()
            self.live.start()
            producer.start()
            self.wait_phases({f"{TASK}-0-128": "Running"})
            self.table("shards before the splits")
            left, _ = self.split(f"{TASK}-0-128")
            self.split(left)
            self.table("shards after two splits (the parents stay for lineage, in phase Split, with no pod)")
            time.sleep(5)
            self._stop_producer.set()
            producer.join()
            ok = self.check_results()
            self.live.stop()
            plot = self.live.save(self.run_dir)
            say(f"rate and lag per shard over the demo, split moments marked: {plot or self.run_dir / 'live.json'}")
            say(f"deleting Task {TASK} (shards and pods go; checkpoints stay under {self.data / 'state'})")
            deleted = self.bed.run_kubectl("delete", "task", TASK, "--wait=true", "--timeout=180s")
            if deleted.returncode != 0:
                say(f"FAILED: deleting Task {TASK} did not finish in 180 s: {deleted.stderr.strip()}")
                return 1
            return 0 if ok else 1
        except RuntimeError as exc:  # a wait timed out, kubectl failed or the operator exited
            say(f"FAILED: {exc}")
            return 1
        finally:
            self._stop_producer.set()
            self.live.stop()
            self.stop()


def main() -> int:
    run_dir = (ROOT / ".run" / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True)
    print(f"TaskShard demo; everything it writes is under {run_dir}", flush=True)
    return Demo(run_dir).run()


if __name__ == "__main__":
    sys.exit(main())
