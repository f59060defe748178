"""One pass of a Task (observe from the cache -> decide -> act -> write status once), and its deletion.

:func:`reconcile_task` (level-based, idempotent; :func:`decide_task` is its pure part):

1. validate the spec; an invalid one becomes ``phase: Failed`` with a Ready condition naming the field (no crash
   loop, nothing else is touched);
2. create the missing initial TaskShards (``initial_ranges(initialShards, maxKeyGroups)``, owned by the Task;
   409 = created before; at most :data:`CREATE_PER_PASS` per pass, the next pass follows at once), but only
   when the active shards and the new ones tile ``[0, maxKeyGroups)``; otherwise nothing is created and
   ``Tiled=False`` names the gap or overlap (with a Warning event);
3. roll the template: when the Task's template hash changed, tell the next shard to run it by annotating it
   ``taskshard.io/template-hash`` (:func:`taskshard_operator.planner.plan_roll`: first a shard that cannot become
   Ready on its template, Failed for any reason or with a pod that cannot start, then the Running ones, each in
   key-group order); one shard at a time, the next only after the previous one's new pod runs and it is not
   Failed (the shard's reconciler does the last-state restart); a template that fails on the rolled shard too
   stops the roll there (``Progressing=False`` reason RollHeld, one Warning event) until it runs or the template
   changes again;
4. scale to ``spec.shards``, or with ``spec.autoscale`` to the count the autoscaler wants
   (:mod:`taskshard_operator.autoscale` decides it over the shards' ``status.live.lagSeconds``, with an event
   AutoscalingUp or AutoscalingDown when it changes, into ``status.autoscale``) (:mod:`taskshard_operator.scaling`
   decides how): above the active shards, one shard at a
   time is asked to split (``spec.split: {requested: true, by: load|midpoint}``, a Normal event ScalingUp);
   below, one pair of adjacent shards at a time is asked to merge (``spec.merge: {with: <right>}`` on the left
   one, a Normal event ScalingDown); each only while nothing else is going on; the decision goes into
   ``status.scaling``;
5. summarise the shards into status (phase, shard count, active shards, conditions Ready/Progressing/Degraded/
   Tiled/Splitting/Scaled, observedGeneration, templateHash, ``selector``: the shard pods' label selector, which
   the scale subresource reports);
6. prune the retired TaskShards (split parents, merged-away shards) beyond ``spec.history.retiredShards`` whose
   successors no longer need them (:mod:`taskshard_operator.retention`) and whose last counts the Task's
   ``status.live.counters`` holds: a prune pod removes their recovery logs and snapshots, then they are deleted,
   with a Normal event HistoryPruned;
7. ``status.live``: the active shards' rate and lag, the watermark of the slowest range (never back), dead letters
   and late records over the Task's life (:func:`taskshard_operator.live.task_live_patch`).

:func:`delete_task` (on deletion, before the finalizer goes): stop every shard pod, wait until they are gone,
then, for ``checkpointRetention: Delete``, run a one-shot cleanup pod that removes ``<storage.path>/<task>`` (or the
task's objects under ``s3a://<bucket>/<prefix>/``).
Shards, ConfigMaps and pods are removed by the garbage collector (owner references). Retain keeps everything on
the storage volume.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from spark_runtime.keygroups import KeyGroupRange
from spark_runtime.live import key_group_metrics_enabled, lag_seconds_status
from taskshard_operator import autoscale, builders, naming, planner, retention, scaling
from taskshard_operator import status as st
from taskshard_operator.act import Create, Decision, Delete, Emit, Event, Patch, carry_out
from taskshard_operator.cache import Observed, parse_task
from taskshard_operator.kube import Kube
from taskshard_operator.live import task_live_patch, unheld_shards
from taskshard_operator.models.shard import ShardPhase
from taskshard_operator.models.task import CheckpointRetention, HistorySpec, ScalingDecision, TaskPhase, TaskSpec
from taskshard_operator.reconcile_shard import first_error
from taskshard_operator.views import shard_views

PRUNE_LOOK_SECONDS = 3.0
"""How soon a Task pass looks at its prune pod again (a pod's change does not start a Task pass by itself)."""
CREATE_PER_PASS = 20
"""At most this many TaskShards are created in one pass (a pass stays short; the next one follows at once). While
more batches follow, the Task's status is written once (Progressing reason Creating), then when they are done."""
CREATE_CONCURRENCY = 4
"""The shards of a batch are created this many at a time (they are independent objects)."""


def reconcile_task(kube: Kube, observed: Observed, namespace: str, name: str, *, emit: Emit) -> float | None:
    """One pass for the Task ``namespace/name``. Returns seconds until it wants another pass, or None."""
    decision = decide_task(observed, namespace, name)
    if decision is None:
        return None
    return carry_out(kube, observed, decision, emit=emit)


def decide_task(observed: Observed, namespace: str, name: str) -> Decision | None:
    """The pure part of a Task pass (see the module docstring). None: the Task is gone or being deleted."""
    task = observed.task(namespace, name)
    if task is None or task["metadata"].get("deletionTimestamp"):
        return None
    decision = Decision(naming.TASK_PLURAL, task)
    generation = int(task["metadata"].get("generation") or 1)
    status = task.get("status") or {}

    def cond(type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
        return st.condition(type_, ok, reason, message, generation=generation)

    parsed = observed.task_spec(task)
    if parsed.error is not None:
        message = f"invalid Task spec: {first_error(parsed.error)}; fix it with kubectl edit task {name}"
        if (
            status.get("phase") != TaskPhase.FAILED.value
            or (st.get_condition(status.get("conditions"), st.READY) or {}).get("message") != message
        ):
            decision.events.append(Event("Warning", "InvalidSpec", message))
        _set_status(
            decision,
            {
                "phase": TaskPhase.FAILED.value,
                "observedGeneration": generation,
                "conditions": [
                    cond(st.READY, False, "InvalidSpec", message),
                    cond(st.DEGRADED, True, "InvalidSpec", message),
                ],
            },
        )
        return decision
    spec, target = parsed.spec, parsed.template_hash

    views = shard_views(observed, namespace, name)
    plan = planner.plan_task_shards(
        task=name, max_key_groups=spec.max_key_groups, initial_shards=spec.initial_shards, shards=views
    )
    _create_shards(decision, task, plan.create, target)
    _announce_tiling(decision, status, plan.tiling_error, name, spec)
    nxt = planner.plan_roll(target, views)
    if nxt is not None:
        annotation = {naming.ANNOTATION_TEMPLATE_HASH: target}
        message = f"rolling TaskShard {nxt} to template {target} (last-state restart)"
        # Announced with the patch: the spec edit that changed the template makes this pass's status write conflict.
        announce = Event("Normal", "RollingShard", message)
        decision.actions.append(
            Patch(naming.SHARD_PLURAL, nxt, {"metadata": {"annotations": annotation}}, announce=announce)
        )
    scaled = _scale(decision, observed, status, spec, views, plan, target)
    _summarise(decision, views, plan, spec, target, cond, generation, cond(st.SCALED, *scaled))
    _keep_disruption_budget(decision, task, status, len(planner.owners(views)) + len(plan.create))
    _prune_history(decision, observed, task, spec)
    _set_status(decision, {"selector": naming.shard_selector(name)})
    every_range = not plan.create and plan.tiling_error is None
    _sum_live(decision, observed, {v.name for v in planner.owners(views)}, every_range=every_range)
    shown = st.get_condition(status.get("conditions"), st.PROGRESSING) or {}
    if len(plan.create) > CREATE_PER_PASS and shown.get("reason") == "Creating":
        decision.status.clear()  # more batches follow at once: the status is written when they are done
        decision.events = [e for e in decision.events if not e.reason.startswith("Phase")]
    return decision


def _create_shards(decision: Decision, task: dict[str, Any], ranges: tuple, target: str) -> None:
    for r in ranges[:CREATE_PER_PASS]:
        body = builders.build_shard(task["metadata"]["name"], r, template_hash=target)
        kopf.adopt(body, owner=task)
        message = f"created TaskShard {body['metadata']['name']} for {r}"
        decision.actions.append(Create(naming.SHARD_PLURAL, body, announce=Event("Normal", "ShardCreated", message)))
    decision.concurrent_creates = CREATE_CONCURRENCY
    if len(ranges) > CREATE_PER_PASS:
        decision.again_in(0.0)


def _scale(
    decision: Decision,
    observed: Observed,
    status: dict[str, Any],
    spec: TaskSpec,
    views: list[planner.ShardView],
    plan: planner.TaskPlan,
    target: str,
) -> tuple[bool, str, str]:
    """Step 4: decide about ``spec.shards`` (:func:`taskshard_operator.scaling.decide_scaling`) and add what it
    takes: the split request and its event, the scale-down refusal's event, ``status.scaling``. Returns the Scaled
    condition's status, reason and message."""
    bodies = {s["metadata"]["name"]: s for s in observed.shards_of_task(decision.namespace, decision.name)}
    asks = {n: scaling.split_ask(body) for n, body in bodies.items()}
    merges = {n: ask for n, body in bodies.items() if (ask := scaling.merge_ask(body)) is not None}
    ready, loads, awaiting, grace = _observe_shards(observed, decision.namespace, spec, views, bodies)
    blocked = _scaling_blocked(spec, views, plan, target)
    desired, wanted_by = spec.shards, "spec.shards"
    auto: autoscale.Autoscale | None = None
    if spec.autoscale is not None:
        busy = scaling.busy_reason(views, planner.owners(views), ready=ready, asks=asks, merges=merges, blocked=blocked)
        auto = _autoscale(
            status, spec, views, _lag_signals(observed, decision.namespace, planner.owners(views), spec), busy
        )
        desired = auto.desired
        wanted_by = "the autoscaler's status.autoscale.desiredShards"
    elif status.get("autoscale"):
        _set_status(decision, {"autoscale": None})

    def decide(count: int | None) -> scaling.Scaling:
        return scaling.decide_scaling(
            count,
            views,
            ready=ready,
            loads=loads,
            asks=asks,
            blocked=blocked,
            awaiting_load=awaiting,
            merges=merges,
            wanted_by=wanted_by,
        )

    d = decide(desired)
    if auto is not None and d.reason == scaling.SCALING_STUCK:  # every candidate refused: give the step up
        auto = autoscale.give_up(auto, active=d.active, why=d.message, now=time.time())
        decision.events.append(Event("Warning", autoscale.SCALING_STUCK, auto.message))
        d = decide(auto.desired)
    if auto is not None:
        _record_autoscale(decision, status, auto, active=d.active)
    if d.decision == ScalingDecision.WAIT and grace is not None:
        decision.again_in(grace)  # choose without the load map once the grace is over, if no scrape came
    _ask_for_step(decision, d, asks)
    shown = status.get("scaling") or {}
    _set_status(decision, {"scaling": _scaling_status(shown, d)})
    return d.scaled, d.reason, d.message


def _ask_for_step(decision: Decision, d: scaling.Scaling, asks: Mapping[str, scaling.SplitAsk]) -> None:
    """The shard patch of a Split or Merge decision, announced with the patch, not after the status write: a Task
    changed meanwhile (Kopf annotates it after a spec edit such as kubectl scale) refuses the status write, and the
    next pass only waits for the hand-over."""
    if d.decision == ScalingDecision.SPLIT and d.shard is not None and d.by is not None:
        request = scaling.split_request(d.by, asks[d.shard].split if d.shard in asks else None)
        announce = Event("Normal", "ScalingUp", d.message)
        decision.actions.append(Patch(naming.SHARD_PLURAL, d.shard, {"spec": {"split": request}}, announce=announce))
    if d.decision == ScalingDecision.MERGE and d.shard is not None and d.merge_with is not None:
        announce = Event("Normal", "ScalingDown", d.message)
        patch = {"spec": {"merge": {"with": d.merge_with}}}
        decision.actions.append(Patch(naming.SHARD_PLURAL, d.shard, patch, announce=announce))


@dataclass(frozen=True)
class _LagSignals:
    """The autoscaler's signal from the active shards' last scrapes: lagSeconds per shard (None: none), the rate,
    and the shards whose signal cannot be trusted now, with why."""

    lags: dict[str, int | None]
    rate: float
    unknown: dict[str, str]


def _lag_signals(observed: Observed, namespace: str, active: list[planner.ShardView], spec: TaskSpec) -> _LagSignals:
    """Each active shard's signal from the last scrape of its current pod (the live store, not ``status.live``,
    which keeps a gone pod's last figures): none without a scrape of this pod, stale after three scrape intervals
    without an answer, untrusted while the shard shows NoProgress (or its scrape says it is due to)."""
    lags: dict[str, int | None] = {}
    unknown: dict[str, str] = {}
    rate = 0.0
    for v in active:
        scraped = observed.live(namespace, v.name)
        pod = observed.pod(namespace, v.name)
        lags[v.name] = None
        if scraped is None or not pod.pod_ip or scraped.pod_ip != pod.pod_ip:
            unknown[v.name] = "has no scrape of its running pod yet"
            continue
        if scraped.stale:
            unknown[v.name] = f"has not answered a scrape since {scraped.observed_at}"
            continue
        rate += scraped.stats.rate
        if v.degraded_reason == st.NO_PROGRESS or scraped.stats.batch_running >= spec.no_progress_seconds:
            unknown[v.name] = "shows NoProgress (its batch in flight does not commit)"
        elif scraped.stats.lag_seconds is not None:
            lags[v.name] = lag_seconds_status(scraped.stats.lag_seconds)
    return _LagSignals(lags, rate, unknown)


def _autoscale(
    status: Mapping[str, Any],
    spec: TaskSpec,
    views: list[planner.ShardView],
    signals: _LagSignals,
    busy: str | None,
) -> autoscale.Autoscale:
    """Step 4 with ``spec.autoscale``: the autoscaler's decision (:func:`taskshard_operator.autoscale.
    decide_autoscale`, over the active shards' signals); its count takes the place of ``spec.shards``."""
    assert spec.autoscale is not None
    return autoscale.decide_autoscale(
        spec.autoscale,
        active=len(planner.owners(views)),
        lags=signals.lags,
        rate=signals.rate,
        busy=busy,
        state=autoscale.AutoscaleState.from_status(status.get("autoscale")),
        now=time.time(),
        unknown=signals.unknown,
    )


def _record_autoscale(decision: Decision, status: Mapping[str, Any], a: autoscale.Autoscale, *, active: int) -> None:
    """The autoscaler's event when the count it wants changed (a step up or down; a given-up step has its own
    Warning), its wake-up, and ``status.autoscale``."""
    if a.changed and a.reason != autoscale.SCALING_STUCK:
        up = a.desired > active
        decision.events.append(Event("Normal", "AutoscalingUp" if up else "AutoscalingDown", a.message))
    if a.wake_in is not None:
        decision.again_in(a.wake_in + 1.0)
    _set_status(decision, {"autoscale": a.status(status.get("autoscale"))})


def _scaling_blocked(spec: TaskSpec, views: list[planner.ShardView], plan: planner.TaskPlan, target: str) -> str | None:
    """Why no split may start for ``spec.shards`` now, as far as the Task's own work goes (None: nothing)."""
    rolling = [v.name for v in planner.owners(views) if not (v.wanted_hash == target and v.pod_hash == target)]
    if plan.tiling_error:
        return f"the active shards do not tile [0, {spec.max_key_groups}): {plan.tiling_error}"
    if plan.create:
        return f"{len(plan.create)} initial shards are still to be created"
    if spec.suspend:
        return "the Task is suspended (spec.suspend: true)"
    if rolling:
        return f"the shards roll to template {target}: {_names(rolling)}"
    return None


def _observe_shards(
    observed: Observed,
    namespace: str,
    spec: TaskSpec,
    views: list[planner.ShardView],
    bodies: dict[str, dict[str, Any]],
) -> tuple[set[str], dict[str, scaling.ShardLoad], set[str], float | None]:
    """What the scaler needs of the active shards: those Ready (emitting), their loads over the window (from the
    last scrape of their current pod), and, when the Task counts load maps, the splittable ones without a load
    map yet that started emitting less than ``LOAD_GRACE_SECONDS`` ago (their first scrape is due), with the
    seconds until the first of those graces ends."""
    metrics_on = key_group_metrics_enabled(spec.spark.conf or {})
    now = dt.datetime.now(dt.UTC)
    ready: set[str] = set()
    loads: dict[str, scaling.ShardLoad] = {}
    awaiting: set[str] = set()
    grace: float | None = None
    for v in planner.owners(views):
        body = bodies.get(v.name) or {}
        shown = st.get_condition((body.get("status") or {}).get("conditions"), st.READY) or {}
        if shown.get("status") == "True":
            ready.add(v.name)
        pod = observed.pod(namespace, v.name)
        load = scaling.shard_load(v.key_groups, observed.live(namespace, v.name), pod.pod_ip)
        if load is not None:
            loads[v.name] = load
        elif metrics_on and v.key_groups.size >= 2:
            since = shown.get("lastTransitionTime") if shown.get("status") == "True" else pod.running_since
            left = scaling.LOAD_GRACE_SECONDS - _seconds_since(since, now)
            if left > 0:
                awaiting.add(v.name)
                grace = left if grace is None else min(grace, left)
    return ready, loads, awaiting, grace


def _seconds_since(stamp: str | None, now: dt.datetime) -> float:
    """Seconds since an RFC 3339 time (infinite when absent or unreadable)."""
    try:
        then = dt.datetime.fromisoformat((stamp or "").replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (now - then).total_seconds()


def _scaling_status(shown: dict[str, Any], d: scaling.Scaling) -> dict[str, Any] | None:
    """``status.scaling`` for decision ``d`` (None: spec.shards unset, nothing to show). ``lastTransitionTime``
    changes when the decision, its reason, spec.shards or the shard does; a key the new value lacks is set to None
    (a merge patch removes it)."""
    if d.desired is None:
        return None
    new: dict[str, Any] = {
        "desiredShards": d.desired,
        "activeShards": d.active,
        "decision": d.decision.value,
        "reason": d.reason,
        "message": d.message,
    }
    if d.shard is not None:
        new["shard"] = d.shard
    if d.by is not None:
        new["by"] = d.by.value
    if d.merge_with is not None:
        new["mergeWith"] = d.merge_with
    same = all(shown.get(k) == new.get(k) for k in ("decision", "reason", "desiredShards", "shard"))
    kept = shown.get("lastTransitionTime") if same else None
    new["lastTransitionTime"] = kept or st.now()
    new.update({k: None for k in shown if k not in new})
    return new


def _announce_tiling(
    decision: Decision, status: dict[str, Any], tiling_error: str | None, name: str, spec: TaskSpec
) -> None:
    tiling_was = st.get_condition(status.get("conditions"), st.TILED) or {}
    if tiling_error and tiling_was.get("message") != tiling_error:
        decision.events.append(
            Event(
                "Warning",
                "TilingBroken",
                f"the active shards of {name} do not tile [0, {spec.max_key_groups}): {tiling_error}; the operator "
                "creates no shard and starts no pod over an owned range until they do",
            )
        )


@dataclass(frozen=True)
class _Groups:
    """The Task's shards grouped by what its status says about them (names; ``active`` are views)."""

    active: list
    creating: list[str]
    rolling: list[str]
    splitting: list[str]
    failed: list[str]
    not_running: list[str]
    suspending: list[str]
    stalled: list[str]
    """Shards whose merge takes longer than the Task's bound (Degraded reason MergeStalled)."""
    split_stalled: list[str]
    """Split parents that have not drained within the Task's bound (Degraded reason SplitStalled)."""
    no_progress: list[str]
    """Running shards whose batch in flight has not committed within ``spec.noProgressSeconds`` (NoProgress)."""
    unreachable: list[str]
    """Running shards whose metrics endpoint does not answer (MetricsUnreachable)."""
    held: planner.ShardView | None = None
    """The shard the roll stopped at: the new template fails there too (:func:`taskshard_operator.planner.
    roll_held`)."""

    @property
    def total(self) -> int:
        return len(self.active) + len(self.creating)


def _summarise(decision, views, plan, spec, target, cond, generation, scaled) -> None:
    """Step 4: the Task's status from its shards (the initial shards still to create count as Pending)."""
    active = planner.owners(views)
    creating = [naming.shard_name(decision.name, r) for r in plan.create]
    groups = _Groups(
        active=active,
        creating=creating,
        rolling=[v.name for v in active if not (v.wanted_hash == target and v.pod_hash == target)],
        splitting=[v.name for v in views if v.phase.splitting],
        failed=[v.name for v in active if v.phase == ShardPhase.FAILED],
        not_running=[v.name for v in active if v.phase != ShardPhase.RUNNING] + creating,
        suspending=[v.name for v in active if spec.suspend and v.phase != ShardPhase.SUSPENDED],
        stalled=[v.name for v in views if v.degraded_reason == st.MERGE_STALLED],
        split_stalled=[v.name for v in views if v.degraded_reason == st.SPLIT_STALLED],
        no_progress=[v.name for v in active if v.degraded_reason == st.NO_PROGRESS],
        unreachable=[v.name for v in active if v.degraded_reason == st.METRICS_UNREACHABLE],
        held=planner.roll_held(target, views),
    )
    phase = planner.task_phase(views, tiling_error=plan.tiling_error, suspended=spec.suspend)
    if creating and phase == TaskPhase.RUNNING:
        phase = TaskPhase.PENDING
    old_phase = (decision.body.get("status") or {}).get("phase")
    _set_status(
        decision,
        {
            "phase": phase.value,
            "observedGeneration": generation,
            "shards": groups.total,
            "activeShards": sorted(
                [{"name": v.name, "keyGroups": v.key_groups.label(), "phase": v.phase.value} for v in active]
                + [
                    {"name": naming.shard_name(decision.name, r), "keyGroups": r.label(), "phase": "Pending"}
                    for r in plan.create
                ],
                key=lambda e: KeyGroupRange.from_label(e["keyGroups"]),
            ),
            "templateHash": target,
            "conditions": [*_conditions(cond, spec, plan.tiling_error, groups, target), scaled],
        },
    )
    _announce_held_roll(decision, groups.held, target)
    if old_phase != phase.value:
        decision.events.append(
            Event(
                "Normal" if phase != TaskPhase.DEGRADED else "Warning",
                f"Phase{phase.value}",
                f"task {decision.name}: phase {old_phase or '-'} -> {phase.value}",
            )
        )


ROLL_HELD = "RollHeld"
"""The Task's Progressing reason while a roll stopped at a shard the new template fails on."""


def _held_message(held: planner.ShardView, target: str) -> str:
    why = f" (Degraded reason {held.degraded_reason})" if held.degraded_reason else ""
    return (
        f"rolling to {target} stopped at {held.name}: it fails on this template too{why}, see its conditions; "
        f"no other shard gets this template. Fix the Task again: the new template goes to {held.name} first"
    )


def _announce_held_roll(decision: Decision, held: planner.ShardView | None, target: str) -> None:
    """One Warning event RollHeld when a roll stops at a shard (the Progressing condition did not say so yet)."""
    shown = st.get_condition((decision.body.get("status") or {}).get("conditions"), st.PROGRESSING) or {}
    if held is not None and (shown.get("reason"), shown.get("message")) != (ROLL_HELD, _held_message(held, target)):
        decision.events.append(Event("Warning", ROLL_HELD, _held_message(held, target)))


def _keep_disruption_budget(decision: Decision, task: dict[str, Any], status: Mapping[str, Any], shards: int) -> None:
    """The Task's PodDisruptionBudget follows its shard count: at least all but one driver pod stay during a node
    drain (:func:`taskshard_operator.builders.build_disruption_budget`). Applied when the count the status records
    differs (create, or set ``minAvailable``; idempotent), so a steady Task costs no call."""
    wanted = {"name": naming.disruption_budget_name(decision.name), "minAvailable": max(0, shards - 1)}
    if status.get("disruptionBudget") == wanted:
        return
    body = builders.build_disruption_budget(task=decision.name, min_available=wanted["minAvailable"])
    kopf.adopt(body, owner=task)
    decision.actions.append(Create("poddisruptionbudgets", body))
    _set_status(decision, {"disruptionBudget": wanted})


def _prune_history(decision: Decision, observed: Observed, task: dict[str, Any], spec: TaskSpec) -> None:
    """Step 6: history retention (:mod:`taskshard_operator.retention`). The retired TaskShards beyond
    ``spec.history.retiredShards`` that nothing needs any more lose their storage first (a prune pod removes their
    recovery logs and snapshots), then their objects: each deleted only as the object the cache shows (its uid),
    with one Normal event HistoryPruned naming them, posted with the deletes (the spec edit that lowered the count
    makes the pass's status write conflict: Kopf annotates the Task after it). One prune at a time per Task."""
    shards = observed.shards_of_task(decision.namespace, decision.name)
    keep = spec.history.retired_shards if spec.history is not None else HistorySpec().retired_shards
    unheld = unheld_shards(
        (task.get("status") or {}).get("live"),
        {s["metadata"]["name"]: (s.get("status") or {}).get("live") for s in shards},
    )  # deleted now, they would take counts along that the Task's status.live.counters does not hold yet
    running = observed.prune_pod(decision.namespace, decision.name)
    if running is not None:
        _finish_prune(decision, running, shards, keep, unheld)
        return
    names = retention.prunable(shards, keep)
    if unheld & set(names):
        names = [n for n in names if n not in unheld]
        decision.again_in(PRUNE_LOOK_SECONDS)  # the rest once the Task's live status holds their counts
    if not names:
        return
    task_uid = task["metadata"].get("uid")
    successors = retention.successors_by_parent(shards)
    pod = builders.build_prune_pod(
        task=decision.name, spec=spec, shards=names, successors=successors, task_uid=task_uid
    )
    if pod is None:  # a path without a volume: the operator cannot reach the storage, which stays
        _delete_retired(decision, shards, names, keep, "their storage directories stay: no spec.storage.volume")
        return
    kopf.adopt(pod, owner=task)
    decision.actions.append(Create("pods", pod))
    decision.again_in(PRUNE_LOOK_SECONDS)


def _finish_prune(
    decision: Decision, pod: retention.PrunePodView, shards: list[dict[str, Any]], keep: int, unheld: set[str]
) -> None:
    """The Task's prune pod exists: once it succeeded, delete the retired TaskShards whose storage it pruned (those
    still there) and the pod; a pod that kept shards (storage showed a successor still needs them) stays
    ``retention.PRUNE_RETRY_SECONDS``, then goes with a Normal event HistoryPruneWaiting saying why, and the next
    pass tries them again; a failed one is deleted (the next pass starts another); else look again soon. A shard
    whose counts the Task's ``status.live.counters`` does not hold yet waits for them (and the pod with it)."""
    if pod.deleting:
        decision.again_in(PRUNE_LOOK_SECONDS)
    elif pod.phase == "Succeeded" and unheld & set(pod.pruned):
        decision.again_in(PRUNE_LOOK_SECONDS)
    elif pod.phase == "Succeeded":
        _delete_retired(decision, shards, list(pod.pruned), keep, "their recovery logs and snapshots removed")
        wait = pod.retry_in(time.time()) if pod.kept else 0.0
        if wait > 0:
            decision.again_in(wait)
            return
        if pod.kept:
            kept = "; ".join(f"{shard}: {why}" for shard, why in pod.kept)
            decision.events.append(Event("Normal", "HistoryPruneWaiting", f"kept (storage still needed) {kept}"))
        decision.actions.append(Delete("pods", pod.name, uid=pod.uid, grace=0))
    elif pod.phase == "Failed":
        message = f"the prune pod {pod.name} failed (see its log); it runs again: {_names(list(pod.shards))}"
        decision.events.append(Event("Warning", "HistoryPruneFailed", message))
        decision.actions.append(Delete("pods", pod.name, uid=pod.uid, grace=0))
    else:
        decision.again_in(PRUNE_LOOK_SECONDS)


def _delete_retired(decision: Decision, shards: list[dict[str, Any]], names: list[str], keep: int, how: str) -> None:
    uids = {s["metadata"]["name"]: s["metadata"].get("uid") for s in shards}
    names = [n for n in names if n in uids]
    if not names:
        return
    message = (
        f"deleted {len(names)} retired TaskShards beyond spec.history.retiredShards ({keep}): {_names(names)}; {how}"
    )
    announce = Event("Normal", "HistoryPruned", message)  # with the last delete: a refused status write keeps it
    decision.actions += [
        Delete(naming.SHARD_PLURAL, n, uid=uids.get(n), announce=announce if n == names[-1] else None) for n in names
    ]


def _sum_live(decision: Decision, observed: Observed, active: set[str], *, every_range: bool) -> None:
    """``status.live``: RATE and LAG summed over the active shards' ``status.live``, the watermark of the slowest
    range (never back), dead letters and late records over the Task's life (``taskshard_operator.live``), written
    at most once per live-status interval; a change that comes sooner waits."""
    lives = {
        s["metadata"]["name"]: (s.get("status") or {}).get("live")
        for s in observed.shards_of_task(decision.namespace, decision.name)
    }
    current = (decision.body.get("status") or {}).get("live")
    patch, wait = task_live_patch(current, lives, sorted(active), now=dt.datetime.now(dt.UTC), every_range=every_range)
    if patch is not None:
        _set_status(decision, {"live": patch})
    elif wait is not None:
        decision.again_in(wait)


def _degraded(cond, tiling_error: str | None, g: _Groups) -> dict[str, Any]:
    """Degraded: failed shards first, then shards without progress, broken tiling, stalled merges, stalled splits
    (each names the shards)."""
    if g.failed:
        return cond(st.DEGRADED, True, "ShardsFailed", f"failed: {_names(g.failed)}")
    if g.no_progress:
        message = f"no progress: {_names(g.no_progress)} (see their Degraded condition)"
        return cond(st.DEGRADED, True, st.NO_PROGRESS, message)
    if g.unreachable:
        message = f"metrics unreachable: {_names(g.unreachable)} (see their Degraded condition)"
        return cond(st.DEGRADED, True, st.METRICS_UNREACHABLE, message)
    if tiling_error:
        return cond(st.DEGRADED, True, "TilingBroken", tiling_error)
    if g.stalled:
        message = f"merge stalled: {_names(g.stalled)} (see their Degraded condition for what it waits for)"
        return cond(st.DEGRADED, True, st.MERGE_STALLED, message)
    if g.split_stalled:
        message = f"split stalled: {_names(g.split_stalled)} (see their Degraded condition for what it waits for)"
        return cond(st.DEGRADED, True, st.SPLIT_STALLED, message)
    return cond(st.DEGRADED, False, "Healthy", "")


def _conditions(cond, spec: TaskSpec, tiling_error: str | None, g: _Groups, target: str) -> list[dict[str, Any]]:
    """The Task's conditions: Tiled, Ready, Progressing, Splitting, Degraded."""
    progress = "; ".join(
        filter(
            None,
            [
                f"suspending: {_names(g.suspending)}" if g.suspending else "",
                f"splitting: {', '.join(g.splitting)}" if g.splitting else "",
                f"rolling to {target}: {', '.join(g.rolling)}" if g.rolling else "",
                f"creating {len(g.creating)} shards" if g.creating else "",
            ],
        )
    )
    if g.suspending:
        reason = "Suspending"
    elif g.splitting:
        reason = "Splitting"
    else:
        reason = "Rolling" if g.rolling else ("Creating" if g.creating else "Stable")
    progressing = cond(st.PROGRESSING, bool(g.suspending or g.splitting or g.rolling or g.creating), reason, progress)
    if reason == "Rolling" and g.held is not None:  # nothing moves until that shard runs or the Task changes
        progressing = cond(st.PROGRESSING, False, ROLL_HELD, _held_message(g.held, target))
    return [
        cond(
            st.TILED,
            tiling_error is None,
            "Tiled" if tiling_error is None else "TilingBroken",
            tiling_error or f"{g.total} active shards tile [0, {spec.max_key_groups})",
        ),
        _ready(cond, spec.suspend, g),
        progressing,
        cond(
            st.SPLITTING,
            bool(g.splitting),
            "ShardsSplitting" if g.splitting else "NotSplitting",
            f"splitting: {', '.join(g.splitting)}" if g.splitting else "",
        ),
        _degraded(cond, tiling_error, g),
    ]


def _ready(cond, suspend: bool, g: _Groups) -> dict[str, Any]:
    """The Task's Ready condition: every active shard Running and making progress (False with reason Suspended
    while suspended)."""
    active, not_running = g.active, g.not_running
    if suspend:
        stopped = len(active) - len(g.suspending)
        message = f"suspended (spec.suspend: true): {stopped} of {len(active)} shards stopped with a savepoint"
        return cond(st.READY, False, "Suspended", message)
    if g.no_progress and not not_running:
        return cond(st.READY, False, "ShardsNoProgress", f"no progress: {_names(g.no_progress)}")
    return cond(
        st.READY,
        not not_running and bool(active),
        "AllShardsRunning" if not not_running else "ShardsNotRunning",
        f"not running: {_names(not_running)}" if not_running else f"{len(active)} shards running",
    )


def _names(names: list[str], limit: int = 20) -> str:
    """A list of shard names for a condition message, at most ``limit`` of them and a count of the rest."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _set_status(decision: Decision, patch: dict[str, Any]) -> None:
    """Keep the fields of ``patch`` that change the observed status (conditions compared without times)."""
    current = decision.body.get("status") or {}
    if "conditions" in patch:
        merged = st.set_conditions(current.get("conditions"), *patch["conditions"])
        patch = {**patch, "conditions": merged}
        if st.conditions_equal(merged, current.get("conditions")):
            patch.pop("conditions")
    decision.status.update({k: v for k, v in patch.items() if current.get(k) != v})


def delete_task(kube: Kube, namespace: str, name: str, body: dict[str, Any], *, emit: Emit) -> None:
    """Stop the shard pods, then apply the retention policy. Raises ``kopf.TemporaryError`` while waiting."""
    selector = naming.shard_selector(name)
    if (body.get("status") or {}).get("phase") != TaskPhase.STOPPING.value:
        kube.patch_custom_status(naming.TASK_PLURAL, namespace, name, {"phase": TaskPhase.STOPPING.value})
    pods = kube.list_pods(namespace, selector)
    for pod in pods:
        if not pod["metadata"].get("deletionTimestamp"):
            kube.delete_pod(namespace, pod["metadata"]["name"])
    if pods:
        raise kopf.TemporaryError(f"waiting for {len(pods)} shard pods of {name} to stop", delay=3)
    parsed = parse_task(body)
    if parsed.error is not None:
        return
    spec = parsed.spec
    if spec.checkpoint_retention != CheckpointRetention.DELETE:
        emit(body, "Normal", "CheckpointsRetained", f"checkpoints of {name} kept (checkpointRetention: Retain)")
        return
    cleanup = builders.build_cleanup_pod(task=name, spec=spec, task_uid=(body.get("metadata") or {}).get("uid"))
    if cleanup is None:
        emit(
            body,
            "Warning",
            "CheckpointsRetained",
            f"checkpointRetention: Delete needs spec.storage.s3, or spec.storage.path on spec.storage.volume; "
            f"{name}'s are kept",
        )
        return
    pod_name = cleanup["metadata"]["name"]
    pod = kube.get_pod(namespace, pod_name)
    if pod is None:
        kube.create_pod(namespace, cleanup)
        raise kopf.TemporaryError(f"removing the checkpoints of {name}", delay=2)
    if (pod.get("status") or {}).get("phase") != "Succeeded":
        raise kopf.TemporaryError(f"waiting for cleanup pod {pod_name}", delay=2)
    kube.delete_pod(namespace, pod_name, grace=0)
    where = builders.task_storage_uri(name, spec)
    emit(body, "Normal", "CheckpointsDeleted", f"removed {where} (checkpointRetention: Delete)")
