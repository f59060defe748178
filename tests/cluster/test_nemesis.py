"""The nemesis: one Task through a seeded random life of operations and faults (:mod:`tests.nemesis.schedule`),
while events flow, checked after every step by a verifier that reads the output the way a consumer does
(:mod:`tests.nemesis.verifier`) and by a watcher of emitting owners (no two shards emit one key group at any
instant). At the end every active shard is restarted and checked again.

``make test`` runs a short fixed seed; ``make soak SEED=<n> OPS=<n>`` a long one (``TASKSHARD_NEMESIS_SEED``,
``TASKSHARD_NEMESIS_OPS``; ``TASKSHARD_NEMESIS_STEPS`` replays a shrunk schedule). A failing run prints its seed
and its steps as they resolved.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time

import pytest

from spark_runtime.produce import append_lines
from tests.cluster.operator_fixtures import (  # noqa: F401 - fixtures
    apply,
    driver_pid,
    operator_crds,
    operator_process,
    task_manifest,
    write_events,
)
from tests.cluster.test_operator_e2e import OverlapWatcher
from tests.nemesis.schedule import Step, generate, parse, render
from tests.nemesis.verifier import Verdict, verify
from tests.waiting import get_json, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.nemesis]

SEED = int(os.environ.get("TASKSHARD_NEMESIS_SEED", "58"))
OPS = int(os.environ.get("TASKSHARD_NEMESIS_OPS", "5"))
STEPS = os.environ.get("TASKSHARD_NEMESIS_STEPS", "")
TASK = "life"
SETTLE = 420  # seconds: a hand-over (JVM starts, restore, catch-up) and its batches on a loaded 2-core machine
BATCH = 60  # events written before each step
SETTLED_PHASES = {"Running", "Split", "Merged"}


def malformed(number: int) -> list[str]:
    """The malformed lines written with step ``number``'s events: each must become one dead letter, once."""
    return [f"{{not json, step {number}", f'{{"key": null, "seq": "step {number}"}}']


def active_shards(kubectl) -> list[tuple[str, int, int]]:
    """The Task's active shards ``(name, start, end)``, ordered by range."""
    items = get_json(kubectl, "taskshards", "-l", f"taskshard.io/task={TASK},taskshard.io/active=true")["items"]
    out = []
    for item in items:
        groups = item["spec"]["keyGroups"]
        out.append((item["metadata"]["name"], int(groups["start"]), int(groups["end"])))
    return sorted(out, key=lambda s: s[1])


def settled(kubectl) -> bool:
    """No hand-over in progress; the active shards tile the range, run and emit (Ready); the Task says so too: it
    has observed its latest spec and is not Progressing (no roll, split or creation pending: reason Stable)."""
    task = get_json(kubectl, "task", TASK)
    status = task.get("status") or {}
    progressing = [c for c in status.get("conditions") or [] if c["type"] == "Progressing"]
    if status.get("observedGeneration") != task["metadata"]["generation"]:
        return False
    if not progressing or (progressing[0]["status"], progressing[0]["reason"]) != ("False", "Stable"):
        return False
    items = get_json(kubectl, "taskshards")["items"]
    if any((i.get("status") or {}).get("phase") not in SETTLED_PHASES for i in items):
        return False
    active = [i for i in items if i["metadata"]["labels"].get("taskshard.io/active") == "true"]
    ready = [
        c for i in active for c in (i.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"
    ]  # fmt: skip
    ranges = sorted((int(i["spec"]["keyGroups"]["start"]), int(i["spec"]["keyGroups"]["end"])) for i in active)
    tiled = bool(ranges) and ranges[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    return tiled and len(ready) == len(active) and all(c["status"] == "True" for c in ready)


def patch(kubectl, kind: str, name: str, body: dict) -> None:
    kubectl("patch", kind, name, "--type", "merge", "-p", json.dumps(body))


def signal_runtime(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass  # it ended by itself meanwhile (a hand-over): nothing to signal


def kill_runtime(kubectl, shard: str) -> None:
    """SIGKILL the shard's runtime (its process group) when its container runs; the kubelet restarts it."""
    signal_runtime(wait_for(lambda: driver_pid(kubectl, shard), SETTLE, f"{shard}'s runtime running"), signal.SIGKILL)


def on_standby(kubectl, shard: str) -> bool:
    """The successor's runtime runs and it waits on standby (Ready=False, reason Standby)."""
    try:
        item = get_json(kubectl, "taskshard", shard)
    except Exception:  # noqa: BLE001 - not created yet
        return False
    ready = [c for c in (item.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    return bool(ready) and ready[0]["reason"] == "Standby" and driver_pid(kubectl, shard) is not None


def split_while_frozen(kubectl, name: str, start: int, at: int, end: int) -> None:
    """SIGSTOP ``name``'s runtime, request its split, and SIGCONT it once both children run on standby. While it is
    frozen it must still own its range: it cannot have drained, so no child may own or emit anything yet."""
    frozen = wait_for(lambda: driver_pid(kubectl, name), SETTLE, f"{name}'s runtime running")
    signal_runtime(frozen, signal.SIGSTOP)
    try:
        patch(kubectl, "taskshard", name, {"spec": {"split": {"requested": True, "at": at}}})
        children = (f"{TASK}-{start}-{at}", f"{TASK}-{at}-{end}")
        wait_for(lambda: all(on_standby(kubectl, c) for c in children), SETTLE, f"{children} on standby")
        phase = (get_json(kubectl, "taskshard", name).get("status") or {}).get("phase")
        assert phase in ("SplitRequested", "Draining"), f"{name} frozen mid-split shows {phase}"
    finally:
        signal_runtime(frozen, signal.SIGCONT)


def run_step(kubectl, cluster, op, step: Step, number: int, shards: list[tuple[str, int, int]]) -> None:
    kind = step.effective_kind(shards)
    name, start, end = step.target(shards)
    if kind == "pause":
        split_while_frozen(kubectl, name, start, step.split_at(start, end), end)
    elif kind == "apiserver":
        patch(kubectl, "taskshard", name, {"spec": {"split": {"requested": True, "at": step.split_at(start, end)}}})
        cluster.restart_apiserver()
    elif kind in ("split", "split-kill", "split-abort"):
        at = step.split_at(start, end)
        patch(kubectl, "taskshard", name, {"spec": {"split": {"requested": True, "at": at}}})
        if kind == "split-abort":
            patch(kubectl, "taskshard", name, {"spec": {"split": None}})
        if kind == "split-kill":
            kill_runtime(kubectl, f"{TASK}-{start}-{at}" if step.pick < 0.5 else f"{TASK}-{at}-{end}")
    elif kind == "merge":
        left, right = step.merge_pair(shards)
        patch(kubectl, "taskshard", left, {"spec": {"merge": {"with": right}}})
    elif kind == "kill":
        kill_runtime(kubectl, name)
    elif kind == "evict":
        kubectl("delete", "pod", f"{name}-driver", "--grace-period=0", "--force", "--ignore-not-found")
    elif kind == "operator":
        op.kill()
        op.start()
    elif kind == "suspend":
        patch(kubectl, "task", TASK, {"spec": {"suspend": True}})
        wait_for(
            lambda: (
                all(
                    (i.get("status") or {}).get("phase") == "Suspended"
                    for i in get_json(kubectl, "taskshards", "-l", "taskshard.io/active=true")["items"]
                )
                and not get_json(kubectl, "pods", "-l", "taskshard.io/component=shard")["items"]
            ),
            SETTLE,
            "every active shard Suspended, no shard pod",
        )
        patch(kubectl, "task", TASK, {"spec": {"suspend": False}})
    elif kind == "scale":
        kubectl("scale", "task", TASK, "--replicas", str(step.replicas(shards)))
    elif kind == "prune":
        patch(kubectl, "task", TASK, {"spec": {"history": {"retiredShards": 1}}})
    elif kind == "roll":
        patch(kubectl, "task", TASK, {"spec": {"spark": {"env": [{"name": "NEMESIS_ROLL", "value": str(number)}]}}})


def check(kubectl, data, what: str) -> Verdict:
    """Poll until the Task has settled and its output is exact; fail at once on a doubled or unknown count (no
    later output can undo one)."""
    journal, sink = data / "journal" / TASK, data / "output" / TASK
    deadline = time.monotonic() + SETTLE
    while True:
        verdict = verify(journal, sink)
        assert not verdict.broken, f"{what}: {verdict.summary()}"
        try:
            calm = settled(kubectl)
        except Exception:  # noqa: BLE001 - an API read that failed: ask again
            calm = False
        if verdict.exact and calm:
            return verdict
        assert time.monotonic() < deadline, f"{what}: not settled with exact output in {SETTLE}s: {verdict.summary()}"
        time.sleep(2.0)


def test_a_random_life_of_a_task_stays_exact_to_its_consumer(kube_cluster, kubectl, operator_process, tmp_path):  # noqa: F811
    steps = parse(STEPS) if STEPS else generate(SEED, OPS)
    data = tmp_path / "data"
    data.mkdir()
    op = operator_process
    resolved: list[str] = []
    timings: list[tuple[str, float]] = []
    watcher = OverlapWatcher(kubectl, data)
    watcher.start()
    produced = 0
    try:
        write_events(data, TASK, start=0, count=200)
        produced = 200
        task = task_manifest(TASK, data, max_key_groups=16)
        # No standby rehearsal (a warm-up only, proven by the demo test and the Spark tier): on 2 cores each one
        # costs a JVM's worth of CPU, and this run is about faults.
        task["spec"]["spark"]["conf"]["spark.taskshard.rehearse"] = "false"
        apply(kubectl, task)
        check(kubectl, data, "start")
        for number, step in enumerate(steps, 1):
            write_events(data, TASK, start=produced, count=BATCH)
            produced += BATCH
            append_lines(data / "journal" / TASK, number % 2, malformed(number))
            shards = active_shards(kubectl)
            resolved.append(step.resolve(shards))
            print(f"[nemesis] step {number}/{len(steps)}: {resolved[-1]}", file=sys.stderr)
            began = time.monotonic()
            run_step(kubectl, kube_cluster, op, step, number, shards)
            check(kubectl, data, f"step {number} ({resolved[-1]})")
            timings.append((resolved[-1], time.monotonic() - began))
        # Every shard restartable at the end: each active one is restarted (a new pod) and resumes exactly.
        for name, _, _ in active_shards(kubectl):
            kubectl("delete", "pod", f"{name}-driver", "--grace-period=0", "--force", "--ignore-not-found")
        write_events(data, TASK, start=produced, count=BATCH)
        produced += BATCH
        verdict = check(kubectl, data, "every shard restarted")
        assert verdict.expected_records == produced
        assert verdict.malformed == len(malformed(0)) * len(steps)
    except BaseException:
        print(
            f"[nemesis] FAILED: seed {SEED}, {len(steps)} steps; replay with TASKSHARD_NEMESIS_STEPS='{render(steps)}'"
            f"\n[nemesis] steps as they resolved: {resolved}",
            file=sys.stderr,
        )
        raise
    finally:
        watcher.stop()
    print(f"[nemesis] seed {SEED}: {len(steps)} steps passed: {timings}", file=sys.stderr)
    assert not watcher.violations, watcher.violations
    assert watcher.samples > 10
