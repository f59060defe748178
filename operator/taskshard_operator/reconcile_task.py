"""One reconcile pass of a Task, and its deletion.

:func:`reconcile_task` (level-based, idempotent):

1. validate the spec; an invalid one becomes ``phase: Failed`` with a Ready condition naming the field (no crash
   loop, nothing else is touched);
2. create the missing initial TaskShards (``initial_ranges(initialShards, maxKeyGroups)``, owned by the Task;
   409 = created before), but only when the active shards and the new ones tile ``[0, maxKeyGroups)``; otherwise
   nothing is created and ``Tiled=False`` names the gap or overlap (with a Warning event);
3. roll the template: when the Task's template hash changed, tell the next Running shard (key-group order) to
   run it by annotating it ``taskshard.io/template-hash``; one shard at a time, the next only after the previous
   one's new pod runs (the shard's reconciler does the last-state restart);
4. summarise the shards into status (phase, shard count, active shards, conditions Ready/Progressing/Degraded/
   Tiled, observedGeneration, templateHash).

:func:`delete_task` (on deletion, before the finalizer goes): stop every shard pod, wait until they are gone,
then, for ``checkpointRetention: Delete``, run a one-shot cleanup pod that removes ``<storage.path>/<task>`` (or the
task's objects under ``s3a://<bucket>/<prefix>/``).
Shards, ConfigMaps and pods are removed by the garbage collector (owner references). Retain keeps everything on
the storage volume.
"""

from __future__ import annotations

from typing import Any

import kopf
from pydantic import ValidationError

from taskshard_operator import builders, naming, planner
from taskshard_operator import status as st
from taskshard_operator.kube import Kube
from taskshard_operator.models.task import CheckpointRetention, TaskPhase, TaskSpec
from taskshard_operator.reconcile_shard import Emit, _first_error
from taskshard_operator.views import shard_views


def _write_status(kube: Kube, task: dict[str, Any], patch: dict[str, Any]) -> None:
    current = task.get("status") or {}
    if "conditions" in patch:
        merged = st.set_conditions(current.get("conditions"), *patch["conditions"])
        patch = {**patch, "conditions": merged}
        if st.conditions_equal(merged, current.get("conditions")):
            patch.pop("conditions")
    changed = {k: v for k, v in patch.items() if current.get(k) != v}
    if changed:
        meta = task["metadata"]
        kube.patch_custom_status(naming.TASK_PLURAL, meta["namespace"], meta["name"], changed)


def reconcile_task(kube: Kube, namespace: str, name: str, *, emit: Emit) -> None:
    task = kube.get_custom(naming.TASK_PLURAL, namespace, name)
    if task is None or task["metadata"].get("deletionTimestamp"):
        return
    generation = int(task["metadata"].get("generation") or 1)
    status = task.get("status") or {}

    def cond(type_: str, ok: bool, reason: str, message: str = "") -> dict[str, Any]:
        return st.condition(type_, ok, reason, message, generation=generation)

    # Step 1: validate.
    try:
        spec = TaskSpec.from_k8s(task.get("spec") or {})
    except ValidationError as e:
        message = f"invalid Task spec: {_first_error(e)}; fix it with kubectl edit task {name}"
        if (
            status.get("phase") != TaskPhase.FAILED.value
            or (st.get_condition(status.get("conditions"), st.READY) or {}).get("message") != message
        ):
            emit(task, "Warning", "InvalidSpec", message)
        _write_status(
            kube,
            task,
            {
                "phase": TaskPhase.FAILED.value,
                "observedGeneration": generation,
                "conditions": [
                    cond(st.READY, False, "InvalidSpec", message),
                    cond(st.DEGRADED, True, "InvalidSpec", message),
                ],
            },
        )
        return

    # Step 2: initial shards.
    target = builders.template_hash(spec)
    views = shard_views(kube, namespace, name)
    plan = planner.plan_task_shards(
        task=name, max_key_groups=spec.max_key_groups, initial_shards=spec.initial_shards, shards=views
    )
    for r in plan.create:
        body = builders.build_shard(name, r, template_hash=target)
        kopf.adopt(body, owner=task)
        if kube.create_custom(naming.SHARD_PLURAL, namespace, body) is not None:
            emit(task, "Normal", "ShardCreated", f"created TaskShard {body['metadata']['name']} for {r}")
    if plan.create:
        views = shard_views(kube, namespace, name)
    tiling_was = st.get_condition(status.get("conditions"), st.TILED) or {}
    if plan.tiling_error and tiling_was.get("message") != plan.tiling_error:
        emit(
            task,
            "Warning",
            "TilingBroken",
            f"the active shards of {name} do not tile [0, {spec.max_key_groups}): {plan.tiling_error}; the operator "
            "creates no shard and starts no pod over an owned range until they do",
        )

    # Step 3: roll one shard at a time.
    nxt = planner.plan_roll(target, views)
    if nxt is not None:
        kube.patch_custom(
            naming.SHARD_PLURAL,
            namespace,
            nxt,
            {"metadata": {"annotations": {naming.ANNOTATION_TEMPLATE_HASH: target}}},
        )
        emit(task, "Normal", "RollingShard", f"rolling TaskShard {nxt} to template {target} (last-state restart)")
    owning = planner.owners(views)
    rolling = [v.name for v in owning if not (v.wanted_hash == target and v.pod_hash == target)]

    # Step 4: status.
    active = owning
    phase = planner.task_phase(views, tiling_error=plan.tiling_error)
    splitting = [v.name for v in views if v.phase.value in ("SplitRequested", "Draining", "Drained", "ChildrenCreated")]
    failed = [v.name for v in active if v.phase.value == "Failed"]
    not_running = [v.name for v in active if v.phase.value != "Running"]
    conditions = [
        cond(
            st.TILED,
            plan.tiling_error is None,
            "Tiled" if plan.tiling_error is None else "TilingBroken",
            plan.tiling_error or f"{len(active)} active shards tile [0, {spec.max_key_groups})",
        ),
        cond(
            st.READY,
            not not_running and bool(active),
            "AllShardsRunning" if not not_running else "ShardsNotRunning",
            f"not running: {', '.join(not_running)}" if not_running else f"{len(active)} shards running",
        ),
        cond(
            st.PROGRESSING,
            bool(splitting or rolling or plan.create),
            "Splitting" if splitting else ("Rolling" if rolling else "Stable"),
            "; ".join(
                filter(
                    None,
                    [
                        f"splitting: {', '.join(splitting)}" if splitting else "",
                        f"rolling to {target}: {', '.join(rolling)}" if rolling else "",
                    ],
                )
            ),
        ),
        cond(
            st.SPLITTING,
            bool(splitting),
            "ShardsSplitting" if splitting else "NotSplitting",
            f"splitting: {', '.join(splitting)}" if splitting else "",
        ),
        cond(
            st.DEGRADED,
            bool(failed or plan.tiling_error),
            "ShardsFailed" if failed else ("TilingBroken" if plan.tiling_error else "Healthy"),
            plan.tiling_error or (f"failed: {', '.join(failed)}" if failed else ""),
        ),
    ]
    old_phase = status.get("phase")
    _write_status(
        kube,
        task,
        {
            "phase": phase.value,
            "observedGeneration": generation,
            "shards": len(active),
            "activeShards": [
                {"name": v.name, "keyGroups": v.key_groups.label(), "phase": v.phase.value} for v in active
            ],
            "templateHash": target,
            "conditions": conditions,
        },
    )
    if old_phase != phase.value:
        emit(
            task,
            "Normal" if phase != TaskPhase.DEGRADED else "Warning",
            f"Phase{phase.value}",
            f"task {name}: phase {old_phase or '-'} -> {phase.value}",
        )


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
    try:
        spec = TaskSpec.from_k8s(body.get("spec") or {})
    except ValidationError:
        return
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
