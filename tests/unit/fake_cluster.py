"""The simulated cluster the reconcilers' tests run against: an in-memory API (:class:`FakeKube`) that is also the
passes' cache (:class:`taskshard_operator.cache.Observed`), always fresh unless a test makes it lag, and a world
(kubelet + shard runtime: :func:`world_step`) in which a pod runs once created and, once both of its split children
run (their runtimes caught up and wrote their ready notes), exits 0 with a termination message naming a snapshot
manifest; a Task's prune pod succeeds at the next step. :func:`converge` runs passes and world steps until nothing
changes and checks, at every step, that no two pods process the same key groups and no shard has successors of two
hand-overs."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.protocol import (
    DrainSummary,
    MergeAbortOutcome,
    MergeAbortSummary,
    PruneSummary,
    SplitAbortSummary,
    SummaryEvent,
)
from taskshard_operator import naming
from taskshard_operator import status as st
from taskshard_operator.cache import data_digest, parse_task
from taskshard_operator.kube import Conflict
from taskshard_operator.planner import owners
from taskshard_operator.reconcile_shard import PodReplacementBackoff, reconcile_shard
from taskshard_operator.reconcile_task import reconcile_task
from taskshard_operator.retention import prune_pod_view
from taskshard_operator.views import shard_views

from .operator_spec import NS, SPEC


class Crash(Exception):
    """The operator process died."""


def merge_patch(target: dict, patch: dict) -> dict:
    """Apply a JSON merge patch (None deletes) to ``target`` in place, as the API applies a patch or status write."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge_patch(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


def _matches(obj: dict, selector: str | None) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        k, v = term.split("=")
        if labels.get(k) != v:
            return False
    return True


class FakeKube:
    """The subset of :class:`taskshard_operator.kube.Kube` the reconcilers use, in memory."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.uids = itertools.count(1)
        self.mutations = 0
        self.crash_after: int | None = None
        self.created: list[tuple[str, str]] = []
        self.drained: set[str] = set()
        """Shards whose runtime wrote its drain summary (the world's state, not the API's)."""
        self.successors: dict[str, list[str]] = {}
        """The successors each drained shard's summary names."""
        self.fenced: set[str] = set()
        """Merged shards whose latest writer epoch is an abort's barrier (their ready notes are void)."""
        self.pruned: set[str] = set()
        """Retired shards whose storage a prune pod removed."""
        self.storage_keeps: dict[str, str] = {}
        """Retired shards a prune pod keeps, with why (its storage shows a successor still needs them)."""
        self.scrapes: dict[str, Any] = {}
        """The live store's last scrape per shard (``taskshard_operator.live.Scraped``): none unless a test sets it."""
        self.scraping_on = False
        """The operator scrapes live metrics (MetricsUnreachable is judged): off unless a test turns it on."""
        self.pod_patches: list[tuple[str, dict]] = []
        """Every patch of a pod (the split protocol makes none: the hand-over goes through storage)."""
        self.versions = itertools.count(1)
        self.reads = 0
        """GETs and LISTs through the API (a pass must make none: it reads the cache)."""

    def _bump(self, obj: dict) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self.versions))

    def _mutated(self) -> None:
        self.mutations += 1
        if self.crash_after is not None and self.mutations >= self.crash_after:
            self.crash_after = None
            raise Crash(f"operator killed after mutation {self.mutations}")

    def _new(self, kind: str, body: dict) -> dict | None:
        key = (kind, body["metadata"]["name"])
        if key in self.objects:
            return None
        obj = copy.deepcopy(body)
        obj["metadata"].update(uid=f"uid-{next(self.uids)}", namespace=NS, generation=1)
        self._bump(obj)
        self.objects[key] = obj
        self.created.append(key)
        self._mutated()
        return copy.deepcopy(obj)

    def _get(self, kind: str, name: str) -> dict | None:
        self.reads += 1
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj else None

    def _list(self, kind: str, selector: str | None) -> list[dict]:
        self.reads += 1
        return [copy.deepcopy(o) for (k, _), o in sorted(self.objects.items()) if k == kind and _matches(o, selector)]

    # custom objects
    def get_custom(self, plural, namespace, name):
        return self._get(plural, name)

    def list_custom(self, plural, namespace, selector=None):
        return self._list(plural, selector)

    def create_custom(self, plural, namespace, body):
        return self._new(plural, body)

    def patch_custom(self, plural, namespace, name, patch):
        if plural == "pods":
            self.pod_patches.append((name, copy.deepcopy(patch)))
        obj = self.objects[(plural, name)]
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != obj["metadata"]["resourceVersion"]:
            raise Conflict(f"{plural} {name} changed since {expected}", plural, name)
        merge_patch(obj, patch)
        if "spec" in patch:
            obj["metadata"]["generation"] += 1
        self._bump(obj)
        self._mutated()
        return copy.deepcopy(obj)

    def patch_custom_status(self, plural, namespace, name, status, *, resource_version=None):
        obj = self.objects[(plural, name)]
        if resource_version is not None and resource_version != obj["metadata"]["resourceVersion"]:
            raise Conflict(f"{plural} {name} changed since {resource_version}", plural, name)
        obj.setdefault("status", {})
        merge_patch(obj["status"], status)
        self._bump(obj)
        self._mutated()
        return copy.deepcopy(obj)

    def delete_custom(self, plural, namespace, name, *, uid=None):
        """Delete a TaskShard: with finalizers it gets a deletionTimestamp, else it goes with the objects it owns
        (its pod and ConfigMap: background propagation)."""
        obj = self.objects.get((plural, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return
        if obj["metadata"].get("finalizers"):
            obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            self._bump(obj)
        else:
            owner = obj["metadata"]["uid"]
            del self.objects[(plural, name)]
            for key, other in list(self.objects.items()):
                if any(ref.get("uid") == owner for ref in other["metadata"].get("ownerReferences") or []):
                    del self.objects[key]
        self._mutated()

    # pods
    def get_pod(self, namespace, name):
        return self._get("pods", name)

    def list_pods(self, namespace, selector):
        return self._list("pods", selector)

    def create_pod(self, namespace, body):
        return self._new("pods", body)

    def delete_pod(self, namespace, name, *, uid=None, grace=None):
        if self.objects.pop(("pods", name), None) is not None:
            self._mutated()

    # configmaps, services
    def get_configmap(self, namespace, name):
        return self._get("configmaps", name)

    def apply_configmap(self, namespace, body, *, exists):
        key = ("configmaps", body["metadata"]["name"])
        if key not in self.objects:
            self._new("configmaps", body)
            return "created"
        self.objects[key]["data"] = copy.deepcopy(body["data"])
        self._mutated()
        return "patched"

    def delete_configmap(self, namespace, name):
        if self.objects.pop(("configmaps", name), None) is not None:
            self._mutated()

    def ensure_service(self, namespace, body):
        self._new("services", body)

    def ensure_secret(self, namespace, body):
        if ("secrets", body["metadata"]["name"]) not in self.objects:
            self._new("secrets", body)

    def apply_disruption_budget(self, namespace, body):
        key = ("poddisruptionbudgets", body["metadata"]["name"])
        if key not in self.objects:
            self._new("poddisruptionbudgets", body)
            return
        self.objects[key]["spec"]["minAvailable"] = body["spec"]["minAvailable"]
        self._mutated()

    # the cache (Observed): the objects themselves, read without counting as API reads
    def shard(self, namespace, name):
        obj = self.objects.get(("taskshards", name))
        return copy.deepcopy(obj) if obj else None

    def shards_of_task(self, namespace, task):
        return [
            copy.deepcopy(o)
            for (k, _), o in sorted(self.objects.items())
            if k == "taskshards" and (o["spec"].get("taskRef") or {}).get("name") == task
        ]

    def task(self, namespace, name):
        obj = self.objects.get(("tasks", name))
        return copy.deepcopy(obj) if obj else None

    def task_spec(self, task):
        return parse_task(task)

    def pod(self, namespace, shard):
        return st.pod_view(self.objects.get(("pods", naming.pod_name(shard))))

    def configmap_digest(self, namespace, shard):
        cm = self.objects.get(("configmaps", naming.configmap_name(shard)))
        return data_digest(cm["data"]) if cm else None

    def executors(self, namespace, shard):
        return []  # the simulated world runs no Spark executors

    def live(self, namespace, shard):
        return self.scrapes.get(shard)

    def scraping(self):
        return self.scraping_on  # off unless a test turns it on (its pods' start times are made up)

    def prune_pod(self, namespace, task):
        pod = self.objects.get(("pods", naming.prune_pod_name(task)))
        return prune_pod_view(pod) if pod is not None else None

    def wrote(self, plural, obj, *, created=False):
        pass

    def forget(self, plural, namespace, name):
        pass

    # helpers for tests
    def shards(self) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for (k, _), o in self.objects.items() if k == "taskshards"}

    def pods(self) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for (k, _), o in self.objects.items() if k == "pods"}


def _runs(kube: FakeKube, shard: str, *, aborting: bool = False) -> bool:
    """The shard's driver pod runs (``aborting``: a pod started to abort a merge, else one that processes)."""
    pod = kube.pods().get(naming.pod_name(shard))
    state = (((pod or {}).get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {})
    annotations = (pod or {}).get("metadata", {}).get("annotations") or {}
    return "running" in state and bool(annotations.get(naming.ANNOTATION_ABORT_MERGE)) == aborting


def ready_successors(kube: FakeKube, shard: str) -> list[list[str]]:
    """The hand-overs whose successors of ``shard`` are all ready (in the simulated world: their pods run, so they
    caught up or warmed up and wrote ready notes whose writer epoch is current): at most one split (both children)
    and one merge (the merged shard). A merged shard fenced by a merge abort has void notes until it runs again."""
    children = [
        name for name, s in kube.shards().items() if (s.get("spec", {}).get("restoreFrom") or {}).get("parent") == shard
    ]
    found = []
    if len(children) == 2 and all(_runs(kube, c) for c in children):
        found.append(sorted(children))
    for name, s in kube.shards().items():
        if shard in merge_parents(s) and _runs(kube, name) and name not in kube.fenced:
            found.append([name])
    return found


def children_ready(kube: FakeKube, shard: str) -> bool:
    """One hand-over's successors of ``shard`` are ready and no other's are (the runtime drains for exactly one
    set of successors; ready notes of two hand-overs are a conflict it refuses to act on)."""
    return len(ready_successors(kube, shard)) == 1


def world_step(kube: FakeKube, batch: dict[str, int], *, hand_over: bool = True) -> None:
    """What the kubelet and the runtime do between operator passes: a running parent whose successors are ready
    stops by itself with a drain summary naming them (``hand_over=False``: it keeps running, a hand-over in
    progress); a pod started to abort a merge fences the merged shard and reports whether a parent drained; one
    started to abort a split reports it undone; a prune pod prunes what storage allows (``storage_keeps``)."""
    for _name, pod in kube.pods().items():
        status = pod.setdefault("status", {})
        if pod["metadata"]["labels"].get(naming.LABEL_COMPONENT) == naming.COMPONENT_PRUNE:
            if status.get("phase") == "Succeeded":
                continue
            given = (pod["metadata"].get("annotations") or {})[naming.ANNOTATION_PRUNE_SHARDS].split(",")
            summary = PruneSummary(
                pruned=tuple(s for s in given if s not in kube.storage_keeps),
                kept=tuple((s, kube.storage_keeps[s]) for s in given if s in kube.storage_keeps),
            )  # it removed the storage of those storage showed unneeded, and exited
            status["phase"] = "Succeeded"
            terminated = {"exitCode": 0, "message": json.dumps(summary.to_json()), "finishedAt": st.rfc3339()}
            status["containerStatuses"] = [{"name": "prune", "state": {"terminated": terminated}}]
            kube.pruned.update(summary.pruned)
            continue
        state = (status.get("containerStatuses") or [{}])[0].get("state", {})
        shard = pod["metadata"]["labels"][naming.LABEL_SHARD]
        if not status.get("phase"):
            status.update(
                phase="Running",
                containerStatuses=[{"name": "driver", "restartCount": 0, "state": {"running": {}}, "ready": True}],
            )
            if (pod["metadata"].get("annotations") or {}).get(naming.ANNOTATION_ABORT_MERGE):
                kube.fenced.add(shard)  # the abort claimed a barrier epoch: the merged shard's notes are void
            else:
                kube.fenced.discard(shard)  # a new runtime: new epoch, new notes
        elif "running" in state and (pod["metadata"].get("annotations") or {}).get(naming.ANNOTATION_ABORT_SPLIT):
            children = tuple(pod["metadata"]["annotations"][naming.ANNOTATION_ABORT_SPLIT].split(","))
            _terminate(status, SplitAbortSummary("t", shard, batch.get(shard, 0), children).to_json())  # undone
        elif _runs(kube, shard, aborting=True):
            drained = [p for p in merge_parents(kube.shards()[shard]) if p in kube.drained]
            outcome = MergeAbortOutcome.TOO_LATE if drained else MergeAbortOutcome.ABORTED
            message = MergeAbortSummary("t", shard, outcome, tuple(drained)).to_json()
            _terminate(status, message)
        elif hand_over and "running" in state and children_ready(kube, shard):
            (successors,) = ready_successors(kube, shard)
            batch[shard] = batch.get(shard, 0) + 3
            kube.drained.add(shard)  # the runtime wrote drained.json, then exited
            kube.successors[shard] = successors
            message = DrainSummary(
                SummaryEvent.DRAINED,
                "t",
                shard,
                batch[shard],
                f"/data/state/t/shards/{shard}/snapshots/batch-{batch[shard]}/manifest.json",
            ).to_json()
            _terminate(status, message)


def _terminate(status: dict, message: dict) -> None:
    status.update(
        phase="Succeeded",
        containerStatuses=[
            {
                "name": "driver",
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(message)}},
            }
        ],
    )


def running_ranges(kube: FakeKube) -> list[KeyGroupRange]:
    """The ranges of pods that emit (or may any moment): running or just created, except a successor whose
    parents have not all written a drain summary naming it (such a successor may build state but emits nothing:
    its runtime refuses to restore a summary that names another)."""
    out = []
    for pod in kube.pods().values():
        state = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {})
        if (pod["metadata"].get("annotations") or {}).get(naming.ANNOTATION_ABORT_MERGE):
            continue  # fences and reports; processes nothing
        if naming.LABEL_SHARD not in pod["metadata"]["labels"]:
            continue  # a Task's prune pod: no shard's
        if "running" in state or not (pod.get("status") or {}).get("phase"):  # created = may start any moment
            name = pod["metadata"]["labels"][naming.LABEL_SHARD]
            shard = kube.shards().get(name) or {}
            parent = (shard.get("spec", {}).get("restoreFrom") or {}).get("parent")
            parents = merge_parents(shard) or ([parent] if parent else [])
            if all(p in kube.drained and name in kube.successors.get(p, [name]) for p in parents):
                out.append(KeyGroupRange.from_label(pod["metadata"]["labels"][naming.LABEL_KEY_GROUPS]))
    return out


def merge_parents(shard: dict) -> list[str]:
    """A merged shard's parents (``spec.mergeFrom``), or []."""
    return [p["parent"] for p in (shard.get("spec") or {}).get("mergeFrom") or []]


def successor_sets(kube: FakeKube) -> dict[str, list[list[str]]]:
    """Per shard, the hand-overs whose successors the operator created (a split's two children, a merged shard;
    TaskShards made by hand do not count: they get no pod): one hand-over per shard means never two at once."""
    made = {n: s for n, s in kube.shards().items() if s["metadata"].get("ownerReferences")}
    out: dict[str, list[list[str]]] = {}
    for name in kube.shards():
        children = [n for n, s in made.items() if (s.get("spec", {}).get("restoreFrom") or {}).get("parent") == name]
        merged = [[n] for n, s in made.items() if name in merge_parents(s)]
        sets = ([sorted(children)] if children else []) + merged
        if sets:
            out[name] = sets
    return out


def assert_one_handover_per_shard(kube: FakeKube) -> None:
    for name, sets in successor_sets(kube).items():
        assert len(sets) <= 1, f"{name} has successors of two hand-overs at once: {sets}"


def owner_ranges(kube: FakeKube) -> list[KeyGroupRange]:
    """The ranges the Task's planner counts as owned (what the tiling invariant checks)."""
    return [v.key_groups for v in owners(shard_views(kube, NS, "t"))]


def assert_no_overlap(ranges: list[KeyGroupRange]) -> None:
    ordered = sorted(ranges)
    for a, b in itertools.pairwise(ordered):
        assert a.end <= b.start, f"two running shard pods own key groups of {a} and {b}"


def converge(
    kube: FakeKube,
    events: list,
    *,
    passes: int = 60,
    backoff: PodReplacementBackoff | None = None,
    owners_tile: bool = True,
) -> None:
    """Operator passes and world steps until nothing changes; no two pods ever process the same key groups, and
    (``owners_tile``, unless a test makes an overlapping TaskShard by hand) no two shards own them."""
    backoff = backoff or PodReplacementBackoff(base=0.0)
    batch: dict[str, int] = {}
    for _ in range(passes):
        before = json.dumps(sorted((repr(k), v) for k, v in kube.objects.items()), sort_keys=True, default=str)
        reads = kube.reads
        reconcile_task(kube, kube, NS, "t", emit=lambda *a: events.append(a))
        for name in list(kube.shards()):
            reconcile_shard(kube, kube, NS, name, emit=lambda *a: events.append(a), backoff=backoff)
            assert_no_overlap(running_ranges(kube))
            assert_one_handover_per_shard(kube)
            if owners_tile:
                assert_no_overlap(owner_ranges(kube))
        assert kube.reads == reads, "a pass read through the API instead of the cache"
        world_step(kube, batch)
        assert_no_overlap(running_ranges(kube))
        if json.dumps(sorted((repr(k), v) for k, v in kube.objects.items()), sort_keys=True, default=str) == before:
            return


def new_world(spec: dict | None = None) -> FakeKube:
    kube = FakeKube()
    kube._new(
        "tasks",
        {
            "apiVersion": "taskshard.io/v1alpha1",
            "kind": "Task",
            "metadata": {"name": "t"},
            "spec": copy.deepcopy(spec or SPEC),
        },
    )
    return kube


def request_split(kube: FakeKube, shard: str, **split) -> None:
    kube.patch_custom("taskshards", NS, shard, {"spec": {"split": {"requested": True, **split}}})


def phases(kube: FakeKube) -> dict[str, str]:
    return {n: (s.get("status") or {}).get("phase") for n, s in sorted(kube.shards().items())}


def count_creations(kube: FakeKube, kind: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, name in kube.created:
        if k == kind:
            out[name] = out.get(name, 0) + 1
    return out
