"""A dict-backed :class:`~taskshard_operator.cache.Observed` (:class:`World`, no API at all) and the builders of the
objects a single decision is checked against: shards, pods in each state, configs; :func:`decide` decides one
shard's pass without carrying anything out."""

from __future__ import annotations

import copy
import json
from typing import Any

from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.protocol import DrainSummary, SummaryEvent
from taskshard_operator import builders, naming
from taskshard_operator import status as st
from taskshard_operator.act import ApplyConfigMap, Backoff, Create, Decision, Delete, Patch
from taskshard_operator.cache import data_digest, parse_task
from taskshard_operator.executors import ExecutorView, executor_view
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.reconcile_shard import decide_shard

from .operator_spec import NS, SPEC

TASK = "t"
PARENT = "t-0-16"
LOW, HIGH = "t-0-8", "t-8-16"
OLD_HASH = "0000000000000old"
LONG_AGO = "2020-01-01T00:00:00Z"
DRAIN_SUMMARY = DrainSummary(SummaryEvent.DRAINED, "t", "t-0-128", 7, "/x/manifest.json").to_json()


# ---------------------------------------------------------------- a dict-backed Observed (no API)
class World:
    """:class:`~taskshard_operator.cache.Observed` over plain dicts: shards and tasks by name, pods (API dicts),
    ConfigMap digests and executor pods (lists of API dicts, none by default) by shard name. ``wrote``/``forget``
    only record that they were called (deciding must never call them)."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.shards: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.configmaps: dict[str, str] = {}
        self.executor_pods: dict[str, list[dict[str, Any]]] = {}
        self.scrapes: dict[str, Any] = {}
        self.scraping_on = False
        self.calls: list[tuple] = []
        self.tasks[TASK] = {
            "apiVersion": naming.GROUP_VERSION,
            "kind": "Task",
            "metadata": {
                "name": TASK,
                "namespace": NS,
                "uid": "task-uid",
                "resourceVersion": "1",
                "generation": 1,
                "creationTimestamp": LONG_AGO,
            },
            "spec": copy.deepcopy(spec or SPEC),
            "status": {},
        }

    # Observed
    def shard(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.shards.get(name))

    def shards_of_task(self, namespace: str, task: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for _, s in sorted(self.shards.items()) if s["spec"]["taskRef"]["name"] == task]

    def task(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.tasks.get(name))

    def task_spec(self, task):
        return parse_task(task)

    def pod(self, namespace: str, shard: str) -> st.PodView:
        pod = self.pods.get(shard)
        return st.pod_view(pod) if pod is not None else st.PodView(exists=False)

    def configmap_digest(self, namespace: str, shard: str) -> str | None:
        return self.configmaps.get(shard)

    def executors(self, namespace: str, shard: str) -> list[ExecutorView]:
        return sorted((executor_view(p) for p in self.executor_pods.get(shard, [])), key=lambda v: v.name)

    def live(self, namespace: str, shard: str):
        return self.scrapes.get(shard)

    def scraping(self):
        return self.scraping_on  # off unless a test turns it on (its pods' start times are made up)

    def prune_pod(self, namespace: str, task: str):
        return None  # the decision tests prune no history

    def wrote(self, plural, obj, *, created=False) -> None:
        self.calls.append(("wrote", plural))

    def forget(self, plural, namespace, name) -> None:
        self.calls.append(("forget", plural, name))

    # test helpers
    def snapshot(self) -> str:
        return json.dumps(
            [self.tasks, self.shards, self.pods, self.configmaps, self.executor_pods], sort_keys=True, default=str
        )


def task_hash(world: World | None = None) -> str:
    return parse_task((world or World()).tasks[TASK]).template_hash


HASH = task_hash()


def add_shard(
    world: World,
    name: str,
    *,
    phase: str | None = None,
    status: dict[str, Any] | None = None,
    restore_from: str | None = None,
    generation: int = 1,
    observed_generation: int | None = 1,
    template: str | None = None,
    split: dict[str, Any] | None = None,
    key_groups: KeyGroupRange | None = None,
) -> dict[str, Any]:
    """A TaskShard as the operator creates it (labels, template annotation), with uid, version and a status."""
    if key_groups is None:
        _, start, end = name.rsplit("-", 2)
        key_groups = KeyGroupRange(int(start), int(end))
    restore = None
    if restore_from is not None:
        restore = {"parent": restore_from, "manifest": f"/data/state/t/shards/{restore_from}/drained.json"}
    body = builders.build_shard(TASK, key_groups, template_hash=template or HASH, restore_from=restore)
    body["metadata"].update(name=name, namespace=NS, uid=f"uid-{name}", resourceVersion="10", generation=generation)
    if phase in ("Split", "Stopped"):
        body["metadata"]["labels"][naming.LABEL_ACTIVE] = "false"
    if phase is not None and ShardPhase(phase).splitting:  # as the operator keeps it during a split
        body["metadata"]["finalizers"] = [naming.HANDOVER_FINALIZER]
    if split is not None:
        body["spec"]["split"] = split
    full_status: dict[str, Any] = {}
    if phase is not None:
        full_status["phase"] = phase
    if observed_generation is not None:
        full_status["observedGeneration"] = observed_generation
    full_status.update(status or {})
    body["status"] = full_status
    world.shards[name] = body
    return body


def config_digest(world: World, name: str) -> str:
    """The digest of the ConfigMap the operator would build for shard ``name`` (the in-sync one)."""
    shard, task = world.shards[name], world.tasks[TASK]
    kg = shard["spec"]["keyGroups"]
    r = KeyGroupRange(kg["start"], kg["end"])
    spec = parse_task(task).spec
    config = builders.build_shard_config(
        task=TASK,
        namespace=NS,
        shard=name,
        key_groups=r,
        spec=spec,
        restore_from=shard["spec"].get("restoreFrom"),
        task_created=task["metadata"].get("creationTimestamp"),
        task_uid=task["metadata"].get("uid"),
    )
    cm = builders.build_configmap(task=TASK, shard=name, key_groups=r, config=config, spec=spec)
    return data_digest(cm["data"])


def sync_config(world: World, name: str) -> None:
    world.configmaps[name] = config_digest(world, name)


def make_pod(
    shard: str,
    *,
    phase: str | None = None,
    state: dict[str, Any] | None = None,
    restart_count: int = 0,
    template: str | None = None,
    deleting: bool = False,
    ready: bool | None = None,
) -> dict[str, Any]:
    """A driver pod as the API shows it (``status`` empty: created, not scheduled yet). ``ready`` (the readiness
    probe: the shard emits) defaults to whether the container runs."""
    annotations = {
        naming.ANNOTATION_TEMPLATE_HASH: template or HASH,
        naming.ANNOTATION_RESTARTS_BASE: "0",
    }
    meta: dict[str, Any] = {
        "name": naming.pod_name(shard),
        "namespace": NS,
        "uid": f"pod-uid-{shard}",
        "labels": {naming.LABEL_SHARD: shard},
        "annotations": annotations,
    }
    if deleting:
        meta["deletionTimestamp"] = LONG_AGO
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if state is not None:
        status["containerStatuses"] = [
            {
                "name": naming.CONTAINER_DRIVER,
                "restartCount": restart_count,
                "state": state,
                "ready": "running" in state if ready is None else ready,
            }
        ]
    return {"metadata": meta, "status": status}


def running(started: str = LONG_AGO) -> dict[str, Any]:
    return {"running": {"startedAt": started}}


def terminated(exit_code: int, message: dict[str, Any] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        term["message"] = json.dumps(message)
    return {"terminated": term}


def kinds(decision: Decision) -> list[str]:
    """The actions as short strings, e.g. ``Create(pods)``, ``ApplyConfigMap(new)``, ``Backoff(reset)``."""
    out = []
    for a in decision.actions:
        if isinstance(a, Create | Patch | Delete):
            out.append(f"{type(a).__name__}({a.plural})")
        elif isinstance(a, ApplyConfigMap):
            out.append(f"ApplyConfigMap({'exists' if a.exists else 'new'})")
        elif isinstance(a, Backoff):
            out.append(f"Backoff({'reset' if a.reset else 'record'})")
        else:  # pragma: no cover - a new action type needs a name here
            out.append(repr(a))
    return out


def actions_of(decision: Decision, kind: type, plural: str | None = None) -> list[Any]:
    return [a for a in decision.actions if isinstance(a, kind) and (plural is None or a.plural == plural)]


def condition(decision: Decision, type_: str) -> dict[str, Any] | None:
    return st.get_condition(decision.status.get("conditions"), type_)


def decide(world: World, name: str, backoff_wait: float = 0.0) -> Decision:
    before = world.snapshot()
    decision = decide_shard(world, NS, name, backoff_wait=lambda uid, template=None: backoff_wait)
    assert decision is not None
    assert world.snapshot() == before, "deciding changed the observed world"
    assert world.calls == [], "deciding recorded a write (wrote/forget)"
    return decision


# ---------------------------------------------------------------- split steps
def split_status(**extra: Any) -> dict[str, Any]:
    return {"split": {"at": 8}, "pod": naming.pod_name(PARENT), "restarts": 1, **extra}


def add_children(world: World, *, phases: tuple[str | None, str | None] = (None, None)) -> None:
    for name, phase in zip((LOW, HIGH), phases, strict=True):
        add_shard(world, name, phase=phase, restore_from=PARENT, observed_generation=None)


def drained_status() -> dict[str, Any]:
    return split_status(
        finalCheckpoint={"batchId": 7, "manifest": "/x/manifest.json"}, lineage={"children": [LOW, HIGH]}
    )
