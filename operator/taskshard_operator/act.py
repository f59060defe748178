"""Act in one place: carry out a pass's decision (actions, then one status write, then events).

A decision (:class:`Decision`) is data: the actions in order, the status patch, the events, when to look again.
:func:`carry_out` is the only code that mutates the cluster for a pass:

1. every action, in order (a Task's independent shard creates run a few at a time); a create that finds the
   object (409) counts as done (the step ran before) and posts no event, a new object or a patch made posts its
   ``announce`` event at once; a write's result goes into the cache
   (write-through), and a patch of the object itself carries its new ``resourceVersion`` to the status write (a
   conditional patch that finds a newer version ends the pass: it runs again on fresher state);
2. the status patch, once, conditional on the ``resourceVersion`` the decision was made from: when the object
   changed meanwhile (409), nothing is written and the pass runs again on fresher state;
3. the events (only once the status is written, so a refused write posts nothing twice).

Fault injection for crash tests only: when ``TASKSHARD_CRASH_AFTER_PHASE`` names the phase the status write just
persisted, the process exits with 137 (as if SIGKILLed) before anything acts on it. Never set in production.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from taskshard_operator import metrics, naming
from taskshard_operator.cache import Observed
from taskshard_operator.kube import Conflict, Kube

log = logging.getLogger("taskshard_operator")

CRASH_AFTER_PHASE_ENV = "TASKSHARD_CRASH_AFTER_PHASE"

Emit = Callable[[dict[str, Any], str, str, str], None]
"""``emit(body, type, reason, message)``: post a Kubernetes Event about ``body`` (in production
:func:`taskshard_operator.handlers.runtime.emit`: posted before it returns)."""

CONFLICT_RETRY_SECONDS = 0.2


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str
    about: dict[str, Any] | None = None
    """The object the event is about; None = the decision's own object."""


@dataclass(frozen=True)
class Create:
    """Create ``body`` (``plural``: pods, services, secrets, poddisruptionbudgets or taskshards; services and secrets
    are kept when they exist, a budget's ``minAvailable`` is set); ``announce`` is posted if it is new."""

    plural: str
    body: dict[str, Any]
    announce: Event | None = None


@dataclass(frozen=True)
class ApplyConfigMap:
    """Create the ConfigMap (``exists=False``) or replace its data (``exists=True``)."""

    body: dict[str, Any]
    exists: bool


@dataclass(frozen=True)
class Patch:
    """A merge patch of a TaskShard's metadata or spec (``plural``: taskshards; the operator patches no pod and
    no Task itself; Kopf patches Tasks for its finalizer). ``announce`` is posted once the patch is made, before
    the status write (so a status write refused by a newer version does not lose it: the next pass, which sees
    the patch, has nothing to announce)."""

    plural: str
    name: str
    patch: dict[str, Any]
    announce: Event | None = None


@dataclass(frozen=True)
class Delete:
    plural: str
    """pods, configmaps or taskshards (the children of an aborted split, retired shards beyond the history)."""
    name: str
    uid: str | None = None
    grace: int | None = None
    announce: Event | None = None
    """Posted once the delete call returned (as a Patch's: a refused status write does not lose it)."""


@dataclass(frozen=True)
class Backoff:
    """Record (``reset=False``) or reset the in-memory pod replacement back-off of ``key``; a record counts for
    ``template`` (a new template's replacement starts without back-off)."""

    key: str
    reset: bool = False
    template: str | None = None


Action = Create | ApplyConfigMap | Patch | Delete | Backoff


@dataclass
class Decision:
    """What one pass decided for one object (a Task or a TaskShard)."""

    plural: str
    body: dict[str, Any]
    """The object as observed (its ``resourceVersion`` makes the status write conditional)."""
    status: dict[str, Any] = field(default_factory=dict)
    """The status fields to write (only those that change); empty = no write."""
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    new_phase: str | None = None
    """The phase the status write moves to (for the fault-injection hook), None if unchanged."""
    concurrent_creates: int = 1
    """How many of the creates may run at once (> 1 only where they are independent: a Task's initial shards)."""

    @property
    def namespace(self) -> str:
        return self.body["metadata"].get("namespace") or ""

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    def again_in(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def _do(kube: Kube, observed: Observed, namespace: str, action: Action, backoff: Any) -> dict[str, Any] | None:
    """Carry out one action; returns the object a write returned (or None)."""
    if isinstance(action, Create):
        if action.plural == "pods":
            created = kube.create_pod(namespace, action.body)
            if created is not None:
                observed.wrote("pods", created, created=True)
            return created
        if action.plural == "services":
            kube.ensure_service(namespace, action.body)
            return None
        if action.plural == "secrets":
            kube.ensure_secret(namespace, action.body)
            return None
        if action.plural == "poddisruptionbudgets":
            kube.apply_disruption_budget(namespace, action.body)
            return None
        created = kube.create_custom(action.plural, namespace, action.body)
        if created is not None:
            observed.wrote(action.plural, created, created=True)
        return created
    if isinstance(action, ApplyConfigMap):
        kube.apply_configmap(namespace, action.body, exists=action.exists)
        return None
    if isinstance(action, Patch):
        result = kube.patch_custom(action.plural, namespace, action.name, action.patch)
        observed.wrote(action.plural, result)
        return result
    if isinstance(action, Delete):
        if action.plural == "pods":
            kube.delete_pod(namespace, action.name, uid=action.uid, grace=action.grace)
        elif action.plural == naming.SHARD_PLURAL:
            kube.delete_custom(action.plural, namespace, action.name, uid=action.uid)
        else:
            kube.delete_configmap(namespace, action.name)
        return None
    if isinstance(action, Backoff):
        if action.reset:
            backoff.reset(action.key)
        else:
            backoff.record(action.key, action.template)
        return None
    raise TypeError(f"unknown action {action!r}")


def carry_out(kube: Kube, observed: Observed, decision: Decision, *, emit: Emit, backoff: Any = None) -> float | None:
    """Act on ``decision`` (see the module docstring). Returns seconds until the object wants another pass."""
    ns, name = decision.namespace, decision.name
    body = decision.body
    version = body["metadata"].get("resourceVersion")
    try:
        for action, result in _results(kube, observed, decision, backoff):
            if isinstance(action, Create | Patch) and result is not None and action.announce is not None:
                _post(emit, decision, action.announce)
            if isinstance(action, Delete) and action.announce is not None:
                _post(emit, decision, action.announce)
            if isinstance(action, Patch) and action.plural == decision.plural and action.name == name and result:
                body, version = result, result["metadata"].get("resourceVersion")
    except Conflict as conflict:  # a conditional patch (the object's finalizers, a claim on a neighbour) found a
        # newer version: decide again on fresher state of both
        observed.forget(decision.plural, ns, name)
        if conflict.plural and conflict.name:
            observed.forget(conflict.plural, ns, conflict.name)
        log.debug("%s changed before a conditional patch of %s/%s; the pass runs again", conflict, ns, name)
        return CONFLICT_RETRY_SECONDS
    if decision.status:
        try:
            result = kube.patch_custom_status(decision.plural, ns, name, decision.status, resource_version=version)
        except Conflict:
            observed.forget(decision.plural, ns, name)
            log.debug("%s %s/%s changed meanwhile; the pass runs again", decision.plural, ns, name)
            return CONFLICT_RETRY_SECONDS
        observed.wrote(decision.plural, result)
        body = result
        if decision.new_phase is not None and decision.plural == naming.SHARD_PLURAL:
            metrics.observe_phase(ns, name, decision.new_phase, result.get("status") or {})
        if decision.new_phase is not None and decision.new_phase == os.environ.get(CRASH_AFTER_PHASE_ENV):
            print(f"[fault injection] {name}: exiting after writing phase {decision.new_phase}", flush=True)
            os._exit(137)
    for event in decision.events:
        _post(emit, decision, event, body)
    return decision.requeue_after


def _results(kube: Kube, observed: Observed, decision: Decision, backoff: Any):
    """``(action, result)`` in the decision's order; with ``concurrent_creates > 1`` the creates run on that many
    threads first (they are independent), then the other actions in order."""
    if decision.concurrent_creates <= 1:
        for action in decision.actions:
            yield action, _do(kube, observed, decision.namespace, action, backoff)
        return
    creates = [a for a in decision.actions if isinstance(a, Create)]
    with ThreadPoolExecutor(max_workers=decision.concurrent_creates) as pool:
        results = list(pool.map(lambda a: _do(kube, observed, decision.namespace, a, backoff), creates))
    yield from zip(creates, results, strict=True)
    for action in decision.actions:
        if not isinstance(action, Create):
            yield action, _do(kube, observed, decision.namespace, action, backoff)


def _post(emit: Emit, decision: Decision, event: Event, body: dict[str, Any] | None = None) -> None:
    emit(event.about or body or decision.body, event.type, event.reason, event.message)


__all__ = [
    "CRASH_AFTER_PHASE_ENV",
    "Action",
    "ApplyConfigMap",
    "Backoff",
    "Create",
    "Decision",
    "Delete",
    "Emit",
    "Event",
    "Patch",
    "carry_out",
]
