"""What the planners see of a Task's shards: one :class:`~taskshard_operator.planner.ShardView` per TaskShard.

A Task's shards are found by ``spec.taskRef`` (every TaskShard of the namespace is listed), not by a label: a
TaskShard created by hand without the operator's labels still counts, so it can never own a range unseen.
"""

from __future__ import annotations

from spark_runtime.keygroups import KeyGroupRange
from taskshard_operator import naming, planner
from taskshard_operator import status as st
from taskshard_operator.kube import Kube
from taskshard_operator.phases import parse_phase

__all__ = ["shard_views"]


def shard_views(kube: Kube, namespace: str, task: str) -> list[planner.ShardView]:
    """The Task's shards (``spec.taskRef.name == task``) with their pods, in key-group order."""
    pods = {}
    for pod in kube.list_pods(namespace, naming.shard_selector(task)):
        shard = (pod["metadata"].get("labels") or {}).get(naming.LABEL_SHARD)
        if shard:
            pods[shard] = st.pod_view(pod)
    views = []
    for shard in kube.list_custom(naming.SHARD_PLURAL, namespace):
        if (shard.get("spec") or {}).get("taskRef", {}).get("name") != task:
            continue
        name = shard["metadata"]["name"]
        kg = shard["spec"]["keyGroups"]
        pod = pods.get(name, st.PodView(exists=False))
        views.append(
            planner.ShardView(
                name=name,
                key_groups=KeyGroupRange(kg["start"], kg["end"]),
                phase=parse_phase((shard.get("status") or {}).get("phase")),
                restored=bool(shard["spec"].get("restoreFrom")),
                wanted_hash=(shard["metadata"].get("annotations") or {}).get(naming.ANNOTATION_TEMPLATE_HASH),
                pod_hash=pod.template_hash if pod.exists else None,
                pod_ready=pod.running and not pod.deleting,
                parent=(shard["spec"].get("restoreFrom") or {}).get("parent"),
            )
        )
    return sorted(views, key=lambda v: v.key_groups)
