"""What the reconcile passes observe: a watch-fed cache, never a GET of an object the operator watches.

The operator watches Tasks, TaskShards, shard pods, shard ConfigMaps and executor pods through Kopf indexes
(``handlers/indexes.py``); each index stores a small record per object (the index functions below are pure).
A pass reads them through :class:`Observed`; :class:`KopfCache` is the production implementation, the unit
tests' in-memory world is another.

Records:

- TaskShard and Task: the object without ``metadata.managedFields`` (``metadata``, ``spec``, ``status``);
- shard pod: a :class:`~taskshard_operator.status.PodView` (what the planners need, a few hundred bytes);
- shard ConfigMap: :func:`data_digest` of its ``data`` (a ConfigMap is applied only when the digest differs);
- executor pod (created by a shard's driver, ``taskshard.io/component=executor``): an
  :class:`~taskshard_operator.executors.ExecutorView`, several per shard (never written, so no overlay).

Write-through: a write returns the object as the API stored it. :meth:`KopfCache.wrote` keeps it as an overlay
until the watch delivers that ``resourceVersion`` or a newer one, so the next pass never decides on a status
older than the pass's own last write (and shards created by a pass count at once). A created pod is kept until
the watch shows a pod of its name (a pass right after the create does not create it again). An updated object
that the watch no longer shows was deleted: its overlay goes at once. Overlays expire after
:data:`OVERLAY_TTL` seconds in any case. Writes are also conditional (``resourceVersion`` precondition), so a
stale read can delay a step but never overwrite a newer status.

The Task spec is parsed once per ``resourceVersion`` (:meth:`Observed.task_spec`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from taskshard_operator import builders, naming
from taskshard_operator import status as st
from taskshard_operator.executors import ExecutorView
from taskshard_operator.install_defaults import InstallDefaults, install_defaults
from taskshard_operator.live import LiveStore, Scraped, ScrapeTarget, TaskFigures
from taskshard_operator.models.task import TaskSpec
from taskshard_operator.retention import PrunePodView

OVERLAY_TTL = 30.0
"""Seconds a write-through overlay outlives its write when the watch never delivers its version."""

SPEC_MEMO_SIZE = 256


# ---------------------------------------------------------------- records (pure)


def object_record(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Task or TaskShard as the cache keeps it: the object without ``metadata.managedFields``."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": meta,
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


def data_digest(data: Mapping[str, str] | None) -> str:
    """SHA-256 of a ConfigMap's ``data`` (canonical JSON)."""
    return hashlib.sha256(json.dumps(dict(data or {}), sort_keys=True).encode()).hexdigest()


def task_of(shard: Mapping[str, Any]) -> str | None:
    """``spec.taskRef.name`` of a TaskShard."""
    return ((shard.get("spec") or {}).get("taskRef") or {}).get("name")


def shard_of(body: Mapping[str, Any]) -> str | None:
    """The shard a pod or ConfigMap belongs to (label ``taskshard.io/shard``)."""
    return ((body.get("metadata") or {}).get("labels") or {}).get(naming.LABEL_SHARD)


def _version(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def not_older(seen: str | None, written: str | None) -> bool:
    """The watch delivered the written version or a newer one (etcd resource versions are integers)."""
    if seen is None or written is None:
        return False
    if seen == written:
        return True
    return seen.isdigit() and written.isdigit() and int(seen) > int(written)


@dataclass(frozen=True)
class ParsedTask:
    """A Task spec parsed once per resourceVersion: the model and its template hash, or the validation error."""

    spec: TaskSpec | None
    template_hash: str | None
    error: ValidationError | None


def parse_task(task: Mapping[str, Any], defaults: InstallDefaults | None = None) -> ParsedTask:
    """The Task's effective spec: as written, with what it leaves open filled from the release's ``defaults``
    (:mod:`taskshard_operator.install_defaults`; None: this process's)."""
    try:
        spec = TaskSpec.from_k8s(task.get("spec") or {})
    except ValidationError as e:
        return ParsedTask(None, None, e)
    namespace = (task.get("metadata") or {}).get("namespace")
    spec = (defaults or install_defaults()).apply(spec, namespace)
    return ParsedTask(spec, builders.template_hash(spec), None)


# ---------------------------------------------------------------- what a pass reads


class Observed(Protocol):
    """The read side of a pass. Every method answers from memory."""

    def shard(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def shards_of_task(self, namespace: str, task: str) -> list[dict[str, Any]]: ...

    def task(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def task_spec(self, task: Mapping[str, Any]) -> ParsedTask: ...

    def pod(self, namespace: str, shard: str) -> st.PodView: ...

    def configmap_digest(self, namespace: str, shard: str) -> str | None: ...

    def executors(self, namespace: str, shard: str) -> list[ExecutorView]:
        """The shard's executor pods (its driver created them), by name; empty when there are none."""
        ...

    def live(self, namespace: str, shard: str) -> Scraped | None:
        """The last scrape of the shard's metrics endpoint (``taskshard_operator.live``), None when none."""
        ...

    def scraping(self) -> bool:
        """The operator scrapes running shards' metrics endpoints (``--live-status-seconds`` above 0): a running
        driver that never answers is then MetricsUnreachable."""
        ...

    def prune_pod(self, namespace: str, task: str) -> PrunePodView | None:
        """The Task's prune pod (history retention, :mod:`taskshard_operator.retention`), None when none."""
        ...

    def wrote(self, plural: str, obj: Mapping[str, Any], *, created: bool = False) -> None:
        """Record an object a write returned (write-through); ``created``: the write made it (the watch has not
        shown it yet), else it updated an object the watch had shown."""
        ...

    def forget(self, plural: str, namespace: str, name: str) -> None:
        """Drop the overlay of an object whose write was refused (its version is unknown now)."""
        ...


class SpecMemo:
    """:func:`parse_task` memoised by (uid, resourceVersion); bounded, thread-safe."""

    def __init__(self, size: int = SPEC_MEMO_SIZE) -> None:
        self._size = size
        self._memo: dict[tuple[str | None, str | None], ParsedTask] = {}
        self._lock = threading.Lock()

    def get(self, task: Mapping[str, Any]) -> ParsedTask:
        meta = task.get("metadata") or {}
        key = (meta.get("uid"), meta.get("resourceVersion"))
        if key[1] is None:
            return parse_task(task)
        with self._lock:
            hit = self._memo.get(key)
        if hit is not None:
            return hit
        parsed = parse_task(task)
        with self._lock:
            if len(self._memo) >= self._size:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = parsed
        return parsed


class KopfCache:
    """:class:`Observed` over the Kopf indexes named in ``handlers/indexes.py``, plus write-through overlays.

    The indexes are live mappings Kopf updates on its event loop; reads copy a store (``list(...)``, atomic in
    CPython) before using it. :meth:`bind` is called once with the handler kwargs that carry the indexes.
    """

    SHARDS, SHARDS_BY_TASK, TASKS, PODS, CONFIGMAPS, EXECUTORS = (
        "taskshard_by_name",
        "taskshards_by_task",
        "task_by_name",
        "shard_pod",
        "shard_configmap",
        "executor_pods",
    )
    PRUNE_PODS = "prune_pods"
    INDEXES = (SHARDS, SHARDS_BY_TASK, TASKS, PODS, CONFIGMAPS, EXECUTORS, PRUNE_PODS)
    """Every index id: each is a Kopf index function's id (``handlers/indexes.py``) and the kwarg Kopf passes it
    under to every handler, so :meth:`bind` finds it in the startup handler's kwargs."""

    def __init__(self) -> None:
        self._indexes: dict[str, Mapping[Any, Any]] = {}
        self._overlay: dict[tuple[str, str, str], tuple[float, dict[str, Any], bool]] = {}
        self._lock = threading.Lock()
        self._specs = SpecMemo()
        self.live_store = LiveStore()

    def bind(self, kwargs: Mapping[str, Any]) -> None:
        for name in self.INDEXES:
            self._indexes[name] = kwargs[name]

    @property
    def bound(self) -> bool:
        return bool(self._indexes)

    def _values(self, index: str, key: Any) -> list[Any]:
        store = self._indexes[index].get(key)
        return list(store) if store is not None else []

    def _one(self, index: str, key: Any) -> Any:
        values = self._values(index, key)
        return values[0] if values else None

    def _fresh(self, plural: str, namespace: str, name: str, seen: dict[str, Any] | None) -> dict[str, Any] | None:
        """The watched record, or this operator's newer write of it."""
        key = (plural, namespace, name)
        with self._lock:
            entry = self._overlay.get(key)
            if entry is None:
                return seen
            written_at, obj, created = entry
            gone = seen is None and not created  # updated, then deleted: the watch no longer shows it
            if gone or not_older(_version(seen), _version(obj)) or time.monotonic() - written_at > OVERLAY_TTL:
                del self._overlay[key]
                return seen
        return obj

    # ------------------------------------------------------------ Observed
    def shard(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._fresh(naming.SHARD_PLURAL, namespace, name, self._one(self.SHARDS, (namespace, name)))

    def shards_of_task(self, namespace: str, task: str) -> list[dict[str, Any]]:
        seen = {s["metadata"]["name"]: s for s in self._values(self.SHARDS_BY_TASK, (namespace, task))}
        with self._lock:
            written = [
                name
                for (plural, ns, name), (_, obj, _) in self._overlay.items()
                if plural == naming.SHARD_PLURAL and ns == namespace and task_of(obj) == task
            ]
        names = set(seen) | set(written)
        found = (self._fresh(naming.SHARD_PLURAL, namespace, n, seen.get(n)) for n in sorted(names))
        return [s for s in found if s is not None]

    def task(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._fresh(naming.TASK_PLURAL, namespace, name, self._one(self.TASKS, (namespace, name)))

    def task_spec(self, task: Mapping[str, Any]) -> ParsedTask:
        return self._specs.get(task)

    def pod(self, namespace: str, shard: str) -> st.PodView:
        seen = self._one(self.PODS, (namespace, shard)) or st.PodView(exists=False)
        key = ("pods", namespace, shard)
        with self._lock:
            entry = self._overlay.get(key)
            if entry is None:
                return seen
            written_at, created, _ = entry
            if seen.exists or time.monotonic() - written_at > OVERLAY_TTL:
                del self._overlay[key]  # the watch shows a pod of that name (this one or, gone, its successor)
                return seen
        return st.pod_view(created)

    def configmap_digest(self, namespace: str, shard: str) -> str | None:
        return self._one(self.CONFIGMAPS, (namespace, shard))

    def prune_pod(self, namespace: str, task: str) -> PrunePodView | None:
        return self._one(self.PRUNE_PODS, (namespace, task))

    def executors(self, namespace: str, shard: str) -> list[ExecutorView]:
        return sorted(self._values(self.EXECUTORS, (namespace, shard)), key=lambda v: v.name)

    def live(self, namespace: str, shard: str) -> Scraped | None:
        return self.live_store.get(namespace, shard)

    def scraping(self) -> bool:
        return self.live_store.enabled

    def scrape_targets(self) -> list[ScrapeTarget]:
        """Every shard driver pod that runs and has an IP (what the live-status scraper polls)."""
        index = self._indexes.get(self.PODS, {})
        out = []
        for key in list(index):
            for pod in list(index.get(key) or []):
                if pod.running and not pod.deleting and pod.pod_ip:
                    out.append(ScrapeTarget(key[0], key[1], pod.pod_ip))
        return out

    def shard_live(self, namespace: str, shard: str) -> dict[str, Any] | None:
        """``status.live`` of a TaskShard as observed (with this operator's own newer write)."""
        record = self.shard(namespace, shard)
        return ((record or {}).get("status") or {}).get("live")

    def wrote(self, plural: str, obj: Mapping[str, Any], *, created: bool = False) -> None:
        meta = obj.get("metadata") or {}
        name = (meta.get("labels") or {}).get(naming.LABEL_SHARD) if plural == "pods" else meta.get("name")
        key = (plural, meta.get("namespace") or "", name or "")
        with self._lock:
            self._overlay[key] = (time.monotonic(), object_record(obj), created)

    def forget(self, plural: str, namespace: str, name: str) -> None:
        with self._lock:
            self._overlay.pop((plural, namespace, name), None)

    def task_figures(self) -> list[tuple[str, str, TaskFigures]]:
        """``(namespace, name, figures)`` of every watched Task that shows a ``status.live``, for the metrics."""
        index = self._indexes.get(self.TASKS, {})
        out = []
        for namespace, name in list(index):
            record = self.task(namespace, name)
            figures = TaskFigures.of_live(((record or {}).get("status") or {}).get("live"))
            if figures is not None:
                out.append((namespace, name, figures))
        return out

    def shard_phases(self) -> list[str]:
        """``status.phase`` of every watched TaskShard (Pending when not set yet), for the metrics."""
        index = self._indexes.get(self.SHARDS, {})
        return [
            (record.get("status") or {}).get("phase") or "Pending"
            for key in list(index)
            for record in list(index.get(key) or [])
        ]

    def keys(self) -> list[tuple[str, str, str]]:
        """Every watched Task and TaskShard as a work-queue key (``("task"|"shard", namespace, name)``)."""
        out = [("task", ns, name) for (ns, name) in list(self._indexes.get(self.TASKS, {}))]
        out += [("shard", ns, name) for (ns, name) in list(self._indexes.get(self.SHARDS, {}))]
        return out
