"""The operator end to end: real control plane, node agent, real Spark in the shard pods.

Scenarios share Spark pods to stay affordable on two cores:

- ``test_demo_splits_pod_kill_bad_requests_suspend_resume``: a Task with one shard; a killed shard pod is
  replaced and resumes; two splits leave three active shards; bad split requests are refused and change nothing;
  the Task is suspended (no pods, shards Suspended, a split request waits) and resumed (the waiting split runs);
  per-key results equal a plain-Python reference after each stage; at no instant do two running pods own a key
  group; ``spec.history.retiredShards: 1`` then prunes the two older split parents (their recovery logs and
  snapshots, then their TaskShards) and nothing else.
- ``test_operator_killed_mid_split_at_each_step``: four splits, the operator dies right after persisting each
  step in turn (SplitRequested, Draining, Drained, ChildrenCreated) and a fresh one completes the split with
  exactly the expected children; results stay exact.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time

import pytest

from spark_runtime.keygroups import KeyGroupRange
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    actual_counts,
    apply,
    expected_counts,
    operator_crds,
    operator_process,
    running_pods,
    shard_phases,
    split,
    task_manifest,
    wait_phases,
    wait_results,
    write_events,
)
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.cluster

START = 300  # seconds: JVM start, restore, first batches on a loaded 2-core machine


class OverlapWatcher(threading.Thread):
    """Polls the shard pods; records any instant at which two shards **emit** key groups of one range.

    "Emitting" is the runtime's truth, not the operator's phases: a pod counts while it runs and its container is
    Ready (the readiness probe is the runtime's "emitting" file: a split child catching up, or a successor on
    standby, is not Ready) and its shard has no drain summary in storage (``drained.json``: written as the last
    step of a final drain, after which the runtime never processes again). :func:`assert_single_hand_over` checks
    the order of the parent's last commit and the children's first output from the files as well."""

    def __init__(self, kubectl, data) -> None:
        super().__init__(daemon=True)
        self.kubectl = kubectl
        self.data = data
        self.stop_event = threading.Event()
        self.violations: list[str] = []
        self.samples = 0

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            try:
                # Pods, then storage, then the pods again: a pod counts only if it was emitting in both reads.
                before = get_json(self.kubectl, "pods", "-l", "taskshard.io/component=shard")["items"]
                drained = self._drained()
                after = get_json(self.kubectl, "pods", "-l", "taskshard.io/component=shard")["items"]
            except Exception:  # noqa: BLE001 - keep watching
                continue
            was = {p["metadata"]["uid"] for p in before if self._emitting(p, drained)}
            self.samples += 1
            ranges = sorted(
                (KeyGroupRange.from_label(p["metadata"]["labels"]["taskshard.io/key-groups"]), p["metadata"]["name"])
                for p in after
                if p["metadata"]["uid"] in was and self._emitting(p, drained)
            )
            for (a, na), (b, nb) in itertools.pairwise(ranges):
                if a.end > b.start:
                    self.violations.append(f"{na} {a} and {nb} {b} emit at once")

    def _drained(self) -> set[str]:
        """The shards whose runtime wrote its final drain summary (any Task under the data directory)."""
        return {f.parent.name for f in (self.data / "state").glob("*/shards/*/drained.json")}

    @staticmethod
    def _emitting(pod: dict, drained: set[str]) -> bool:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        ready = (pod.get("status") or {}).get("phase") == "Running" and any(c.get("ready") for c in statuses)
        return ready and pod["metadata"]["labels"].get("taskshard.io/shard") not in drained

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def assert_single_hand_over(data, task: str, parent: str, children) -> None:
    """From the runtime's files: the parent committed nothing after its drain summary, and each child emitted
    nothing before it: its first batch that wrote results was planned after the summary, and a catching-up
    child's batches before it ended at or before the parent's final positions (that first batch may reach them
    and pass them: it emits only what lies past them). Call it once input arrived after the split (a child emits
    only batches with input)."""
    shards = data / "state" / task / "shards"
    summary_path = shards / parent / "drained.json"
    drained = summary_path.stat().st_mtime_ns
    summary = json.loads(summary_path.read_text())
    commits = [f.stat().st_mtime_ns for f in (shards / parent / "checkpoint" / "commits").iterdir()]
    assert max(commits, default=0) <= drained
    for child in children:
        out = data / "output" / task / f"shard={child}"
        wait_for(lambda o=out: any(o.glob("**/batch-*.jsonl")), START, f"{child} emitted its first batch")
        first = min(int(f.name.split("-")[1].split(".")[0]) for f in out.glob("**/batch-*.jsonl"))
        planned = shards / child / "checkpoint" / "offsets" / str(first)
        assert planned.stat().st_mtime_ns >= drained, f"{child} emitted batch {first} planned before {parent} drained"
        if first > 0:  # a catching-up child: its batches up to the parent's final positions wrote nothing
            lines = (shards / child / "checkpoint" / "offsets" / str(first - 1)).read_text().splitlines()
            starts = [json.loads(x) for x in lines[2:] if x.strip().startswith("{")]
            journal = [p for p in starts if all(k.endswith(".jsonl") for k in p)]
            final = summary["positions"]
            assert journal and all(v <= final[k] for k, v in journal[0].items()), (child, journal, final)


def assert_single_merge(data, task: str, parents: list[str], merged: str) -> None:
    """From the runtime's files: neither parent committed anything after its drain summary, and the merged shard
    emitted nothing before both: its first batch that wrote results was planned after the later summary."""
    shards = data / "state" / task / "shards"
    drained = []
    for parent in parents:
        summary = shards / parent / "drained.json"
        drained.append(summary.stat().st_mtime_ns)
        commits = [f.stat().st_mtime_ns for f in (shards / parent / "checkpoint" / "commits").iterdir()]
        assert max(commits, default=0) <= drained[-1], f"{parent} committed after its drain summary"
    out = data / "output" / task / f"shard={merged}"
    wait_for(lambda: any(out.glob("**/batch-*.jsonl")), START, f"{merged} emitted its first batch")
    first = min(int(f.name.split("-")[1].split(".")[0]) for f in out.glob("**/batch-*.jsonl"))
    planned = shards / merged / "checkpoint" / "offsets" / str(first)
    assert planned.stat().st_mtime_ns >= max(drained), f"{merged} emitted batch {first} planned before both drained"


def assert_operator_metrics(op, *, running: int, completed: int) -> None:
    """The operator's /metrics: shards by phase from its cache, the split counter, passes and API calls counted,
    and the split phases timed."""
    samples = op.metrics()

    def value(name: str, **labels: str) -> float:
        return samples.get((f"taskshard_operator_{name}", tuple(sorted(labels.items()))), 0.0)

    assert value("shards", phase="Running") == running and value("shards", phase="Split") == completed, samples
    assert value("splits_total", outcome="completed") == completed
    assert value("splits_total", outcome="accepted") == completed
    assert (
        value("passes_total", kind="shard", outcome="ok") > 0 and value("passes_total", kind="task", outcome="ok") > 0
    )
    assert value("api_requests_total", method="create_pod", outcome="ok") > 0
    assert value("split_phase_seconds_count", phase="Draining") == completed
    assert value("split_seconds_count") == completed


def scrape_shard(kubectl, shard: str) -> dict[str, float]:
    """The shard driver's own metrics endpoint (http://<pod IP>:9108/metrics), as {series name: value}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    ip = get_json(kubectl, "pod", f"{shard}-driver")["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:9108/metrics", timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.get("shard") == shard or not s.name.startswith("taskshard_shard_"), s
            if not s.labels.get("partition") and s.labels.get("part") in (None, "triggerExecution"):
                out[s.name] = s.value
    return out


def assert_live_status(kubectl, op, shard: str, rows: int) -> None:
    """A running, caught-up shard: its driver's endpoint counts exactly the rows it processed, lag 0; the operator
    mirrors it into status.live (the RATE, LAG and LAST BATCH columns) and counted its scrapes."""

    # The lag and the input-row count are both updated at the runtime's poll (at most once a second), which can run
    # just after the sink published the batch's results: they reach 0 and ``rows`` soon after the results are
    # complete (a count past ``rows`` would never come back: the wait fails then too).
    def caught_up() -> bool:
        try:
            scraped = scrape_shard(kubectl, shard)
        except OSError:  # the endpoint between two polls of a busy driver: ask again
            return False
        lag, emitting = scraped.get("taskshard_shard_lag"), scraped.get("taskshard_shard_emitting")
        return lag == 0 and emitting == 1 and scraped.get("taskshard_shard_rows_total") == rows

    wait_for(caught_up, 60, f"{shard}'s lag 0, emitting, and {rows} input rows")
    scraped = scrape_shard(kubectl, shard)
    assert scraped["taskshard_shard_rows_total"] == rows, scraped
    assert scraped["taskshard_shard_lag"] == 0 and scraped["taskshard_shard_emitting"] == 1, scraped
    batch = int(scraped["taskshard_shard_last_batch"])
    assert batch >= 0
    beat = scraped["taskshard_shard_heartbeat_timestamp_seconds"]
    assert time.time() - 30 < beat <= time.time() + 1, f"the poll loop beats: {beat}"

    # The journal's lag is measured between batches, so the operator may have mirrored this batch while its lag was
    # still the pre-batch value: wait for the mirror of the scrape above (this batch or later, and lag 0).
    def mirrored() -> bool:
        live = status(kubectl, "taskshard", shard).get("live") or {}
        return live.get("batchId", -1) >= batch and live.get("lag") == 0

    wait_for(mirrored, 60, f"status.live of {shard} at batch {batch} with lag 0")
    live = status(kubectl, "taskshard", shard)["live"]
    assert live["lag"] == 0 and live["lagUnit"] == "bytes" and live["emitting"] is True, live
    table = kubectl("get", "taskshard", shard).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:8] == ["NAME", "TASK", "RANGE", "PHASE", "READY", "RATE", "LAG", "LAST"], table
    assert row[5] != "<none>" and row[7] != "<none>" and int(row[7]) >= batch, table
    samples = op.metrics()
    assert samples.get(("taskshard_operator_live_scrapes_total", (("outcome", "ok"),)), 0) > 0


def status(kubectl, kind: str, name: str) -> dict:
    return get_json(kubectl, kind, name).get("status") or {}


def condition(obj_status: dict, type_: str) -> dict:
    return next((c for c in obj_status.get("conditions") or [] if c["type"] == type_), {})


def test_demo_splits_pod_kill_bad_requests_suspend_resume(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    watcher = OverlapWatcher(kubectl, data)
    watcher.start()
    try:
        write_events(data, "demo", start=0, count=400)
        apply(kubectl, task_manifest("demo", data, max_key_groups=16))
        wait_phases(kubectl, {"demo-0-16": "Running"}, START, op)
        first = wait_results(data, "demo", START)
        assert_live_status(kubectl, op, "demo-0-16", sum(first.values()))

        # A killed shard process restarts in place and resumes from its recovery log (restartPolicy OnFailure);
        # a force-deleted pod is replaced by the operator and resumes too.
        pod = get_json(kubectl, "pod", "demo-0-16-driver")
        pid = int(pod["status"]["containerStatuses"][0]["containerID"].split("://")[1])
        os.killpg(pid, signal.SIGKILL)
        # The restarted shard is Running again once it commits a batch (or after a minute without input).
        wait_for(lambda: status(kubectl, "taskshard", "demo-0-16").get("restarts", 0) >= 1, START, "a restart")
        write_events(data, "demo", start=400, count=100)
        wait_phases(kubectl, {"demo-0-16": "Running"}, START, op)
        wait_results(data, "demo", START)
        kubectl("delete", "pod", "demo-0-16-driver", "--grace-period=0", "--force")
        wait_for(lambda: status(kubectl, "taskshard", "demo-0-16").get("restarts", 0) >= 2, START, "a replacement")
        write_events(data, "demo", start=500, count=100)
        wait_phases(kubectl, {"demo-0-16": "Running"}, START, op)
        wait_results(data, "demo", START)

        # Split 1 at the midpoint.
        split(kubectl, "demo-0-16")
        wait_phases(kubectl, {"demo-0-16": "Split", "demo-0-8": "Running", "demo-8-16": "Running"}, START, op)
        parent = status(kubectl, "taskshard", "demo-0-16")
        assert parent["lineage"]["children"] == ["demo-0-8", "demo-8-16"]
        assert parent["finalCheckpoint"]["manifest"].endswith("manifest.json")
        assert "demo-0-16-driver" not in running_pods(kubectl)
        write_events(data, "demo", start=600, count=200)
        wait_results(data, "demo", START)
        assert_single_hand_over(data, "demo", "demo-0-16", ("demo-0-8", "demo-8-16"))
        assert_operator_metrics(op, running=2, completed=1)
        wait_for(
            lambda: (status(kubectl, "task", "demo").get("live") or {}).get("shardsReporting") == 2,
            60,
            "the Task's status.live summing both children",
        )
        assert (status(kubectl, "taskshard", "demo-0-16").get("live") or {}).get("rate") == 0.0, "a drained parent"

        # Split 2 at an explicit point: three active shards.
        split(kubectl, "demo-8-16", at=12)
        wait_phases(kubectl, {"demo-8-16": "Split", "demo-8-12": "Running", "demo-12-16": "Running"}, START, op)
        write_events(data, "demo", start=800, count=200)
        expected = wait_results(data, "demo", START)
        assert sum(expected.values()) == 1000
        task = status(kubectl, "task", "demo")
        wait_for(lambda: status(kubectl, "task", "demo").get("shards") == 3, 60, "task status shards == 3")
        task = status(kubectl, "task", "demo")
        assert [s["keyGroups"] for s in task["activeShards"]] == ["0-8", "8-12", "12-16"]
        assert condition(task, "Tiled")["status"] == "True"
        # After splits, the active label selects exactly the shards that own ranges, and kubectl wait works on
        # them (split parents are active=false; every shard and the Task carry a Splitting condition).
        active = "taskshard.io/task=demo,taskshard.io/active=true"
        names = kubectl("get", "taskshards", "-l", active, "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert sorted(names) == ["demo-0-8", "demo-12-16", "demo-8-12"]
        waited = kubectl("wait", "--for=condition=Ready", "taskshards", "-l", active, "--timeout=120s", check=False)
        assert waited.returncode == 0, waited.stderr
        waited = kubectl("wait", "--for=condition=Splitting=false", "task/demo", "--timeout=60s", check=False)
        assert waited.returncode == 0, waited.stderr

        # Bad requests: refused with a message naming the field and value; nothing changes.
        before = (shard_phases(kubectl), sorted(running_pods(kubectl)))
        bad = kubectl(
            "patch",
            "taskshard",
            "demo-0-8",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"split": {"requested": True, "at": 20}}}),
            check=False,
        )
        assert bad.returncode != 0 and "spec.split.at" in bad.stderr  # the CRD's CEL rule refuses it at once
        bad = kubectl(
            "patch",
            "taskshard",
            "demo-12-16",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"split": {"requested": True, "at": 12}}}),
            check=False,
        )
        assert bad.returncode != 0 and "spec.split.at" in bad.stderr
        split(kubectl, "demo-0-16", at=4)  # a Split parent is not Running: the operator refuses
        wait_for(
            lambda: condition(status(kubectl, "taskshard", "demo-0-16"), "SplitRejected").get("status") == "True",
            60,
            "SplitRejected on demo-0-16",
        )
        message = condition(status(kubectl, "taskshard", "demo-0-16"), "SplitRejected")["message"]
        assert "spec.split.requested" in message and "phase Split" in message
        events = kubectl("get", "events", "--field-selector", "involvedObject.name=demo-0-16", "-o", "json").stdout
        assert "SplitRejected" in events
        assert (shard_phases(kubectl), sorted(running_pods(kubectl))) == before
        write_events(data, "demo", start=1000, count=100)
        wait_results(data, "demo", START)

        # Suspend: every shard stops at a batch boundary with a savepoint and keeps no pod; a split waits.
        kubectl("patch", "task", "demo", "--type=merge", "-p", '{"spec":{"suspend":true}}')
        suspended = {"demo-0-8": "Suspended", "demo-8-12": "Suspended", "demo-12-16": "Suspended"}
        wait_phases(kubectl, suspended, START, op)
        wait_for(lambda: not get_json(kubectl, "pods")["items"], START, "no pods while suspended")
        wait_for(lambda: status(kubectl, "task", "demo").get("phase") == "Suspended", 60, "the Task Suspended")
        write_events(data, "demo", start=1100, count=100)
        split(kubectl, "demo-0-8")
        wait_for(
            lambda: (
                condition(status(kubectl, "taskshard", "demo-0-8"), "SplitRejected").get("reason") == "SplitWaiting"
            ),
            60,
            "the split request waiting on demo-0-8",
        )
        assert shard_phases(kubectl)["demo-0-8"] == "Suspended" and not get_json(kubectl, "pods")["items"]
        # Resume: each shard continues from its recovery log, and the waiting split runs.
        kubectl("patch", "task", "demo", "--type=merge", "-p", '{"spec":{"suspend":false}}')
        resumed = {"demo-0-8": "Split", "demo-0-4": "Running", "demo-4-8": "Running", "demo-8-12": "Running"}
        wait_phases(kubectl, {**resumed, "demo-12-16": "Running"}, START, op)
        expected = wait_results(data, "demo", START)
        assert sum(expected.values()) == 1200
        # History: keep the newest retired shard (demo-0-8); the two older split parents go, their successors
        # having committed batches of their own (the suspend ended their pods with a checkpoint); nothing active
        # is touched.
        kubectl("patch", "task", "demo", "--type=merge", "-p", '{"spec":{"history":{"retiredShards":1}}}')
        active = {"demo-0-4", "demo-4-8", "demo-8-12", "demo-12-16"}
        wait_for(lambda: set(shard_phases(kubectl)) == {"demo-0-8", *active}, 60, "the two older split parents gone")
        assert all(shard_phases(kubectl)[n] == "Running" for n in active)
        (pruned,) = [e for e in get_json(kubectl, "events")["items"] if e["reason"] == "HistoryPruned"]
        assert "demo-0-16" in pruned["message"] and "demo-8-16" in pruned["message"], pruned["message"]
        # Their storage went first (the prune pod): recovery logs and snapshots; the records the results read stay.
        shards_dir = data / "state" / "demo" / "shards"
        for gone in ("demo-0-16", "demo-8-16"):
            left = sorted(p.name for p in (shards_dir / gone).iterdir())
            assert "checkpoint" not in left and "snapshots" not in left and "lineage.json" in left, (gone, left)
        assert (shards_dir / "demo-0-8" / "checkpoint").is_dir(), "the kept retired shard keeps its storage"
        assert not [p for p in get_json(kubectl, "pods")["items"] if p["metadata"]["name"] == "demo-prune"]
        assert actual_counts(data, "demo") == expected, "the final results read the same after pruning"
        # A successor restarted after its parent and grandparent were pruned (an eviction, a template roll)
        # resumes from its own recovery log and the restore plan it recorded, never from their storage.
        restarts = status(kubectl, "taskshard", "demo-8-12").get("restarts", 0)
        kubectl("delete", "pod", "demo-8-12-driver", "--grace-period=0", "--force")
        wait_for(lambda: status(kubectl, "taskshard", "demo-8-12").get("restarts", 0) > restarts, START, "a new pod")
        write_events(data, "demo", start=1200, count=100)
        wait_phases(kubectl, {"demo-8-12": "Running"}, START, op)
        assert sum(wait_results(data, "demo", START).values()) == 1300
    finally:
        watcher.stop()
    assert watcher.samples > 10
    assert not watcher.violations, watcher.violations


CRASH_STEPS = [
    ("crash-0-32", "SplitRequested", ("crash-0-16", "crash-16-32")),
    ("crash-0-16", "Draining", ("crash-0-8", "crash-8-16")),
    ("crash-16-32", "Drained", ("crash-16-24", "crash-24-32")),
    ("crash-0-8", "ChildrenCreated", ("crash-0-4", "crash-4-8")),
]


def test_operator_killed_mid_split_at_each_step(kubectl, operator_process, tmp_path):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    watcher = OverlapWatcher(kubectl, data)
    watcher.start()
    produced = 0
    try:
        write_events(data, "crash", start=0, count=300)
        produced = 300
        task = task_manifest("crash", data, max_key_groups=32)
        # The children skip their standby rehearsal (a warm-up only, proven by the demo test and the Spark tier):
        # this test is about the operator dying at each step, and six rehearsals on 2 cores cost minutes.
        task["spec"]["spark"]["conf"]["spark.taskshard.rehearse"] = "false"
        apply(kubectl, task)
        wait_phases(kubectl, {"crash-0-32": "Running"}, START, op)
        wait_results(data, "crash", START)
        expected_shards = {"crash-0-32"}
        for parent, step, children in CRASH_STEPS:
            op.kill()
            op.start(crash_after_phase=step)
            split(kubectl, parent)
            code = op.wait_exit(timeout=START)
            assert code == 137, f"the operator should have died after writing {step}; exit code {code}"
            assert shard_phases(kubectl)[parent] == step
            op.start()
            wait_phases(kubectl, {parent: "Split", **dict.fromkeys(children, "Running")}, START, op)
            expected_shards |= set(children)
            assert set(shard_phases(kubectl)) == expected_shards  # no duplicate or stray children
            write_events(data, "crash", start=produced, count=100)
            produced += 100
            wait_results(data, "crash", START)
            assert_single_hand_over(data, "crash", parent, children)
        assert sum(expected_counts(data, "crash").values()) == produced
        assert actual_counts(data, "crash") == expected_counts(data, "crash")
    finally:
        watcher.stop()
    assert not watcher.violations, watcher.violations
    assert "fault injection" in op.log()
