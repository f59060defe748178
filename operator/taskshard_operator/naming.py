"""Every name, label and annotation the operator writes, in one place (one-line helpers, no I/O).

Names are deterministic functions of the task name and the key-group range, so re-running a step of the split
protocol addresses the same objects (a create that returns 409 means the step was already done).

- TaskShard: ``<task>-<start>-<end>`` for the range ``[start, end)``, e.g. ``orders-0-64`` (a long task name is
  cut and made unique by a digest, see :func:`shard_name`: every derived name and label fits Kubernetes' limits).
- Driver pod: ``<shard>-driver``; ConfigMap: ``<shard>-config``; driver Service (executors): ``<shard>-driver-svc``.
"""

from __future__ import annotations

import hashlib

from spark_runtime.keygroups import KeyGroupRange

DOMAIN = "taskshard.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{DOMAIN}/{API_VERSION}"
TASK_PLURAL = "tasks"
SHARD_PLURAL = "taskshards"

# Labels (selectors) and annotations (operator bookkeeping), all prefixed with the API group.
LABEL_TASK = f"{DOMAIN}/task"
LABEL_SHARD = f"{DOMAIN}/shard"
LABEL_KEY_GROUPS = f"{DOMAIN}/key-groups"
LABEL_COMPONENT = f"{DOMAIN}/component"
LABEL_ACTIVE = f"{DOMAIN}/active"
LABEL_FAMILY = f"{DOMAIN}/family"
"""On a merged shard and the shards split from it: the family suffix of their names (:func:`merge_family`)."""
"""On TaskShards only: ``"true"`` unless the shard's phase is terminal (Split, Stopped), so that
``kubectl get/wait tss -l taskshard.io/task=X,taskshard.io/active=true`` sees the shards that own ranges."""
COMPONENT_SHARD = "shard"
COMPONENT_EXECUTOR = "executor"
COMPONENT_CLEANUP = "cleanup"
COMPONENT_PRUNE = "prune"

ANNOTATION_TEMPLATE_HASH = f"{DOMAIN}/template-hash"
"""On a TaskShard: the Task template hash it should run (set by the Task's roll); on a pod: the one it runs."""
ANNOTATION_ALLOW_FRESH_START = f"{DOMAIN}/allow-fresh-start"
"""On a TaskShard, set by the user: ``"true"`` lets a shard whose recovery log is missing or older than its last
committed batch start over (otherwise it refuses: ``RecoveryLogMissing``)."""
ANNOTATION_RESTARTS_BASE = f"{DOMAIN}/restarts-base"
"""On the driver pod: restarts of the shard before this pod existed (status.restarts = base + restartCount)."""

FINALIZER = f"{DOMAIN}/finalizer"
HANDOVER_FINALIZER = f"{DOMAIN}/split"
"""On a TaskShard while a split or merge of it is in progress (SplitRequested .. ChildrenCreated, AbortingSplit,
MergeRequested, Merging, AbortingMerge): a deletion waits until the hand-over has finished or was undone, so
successors are never left waiting for a parent that is gone. (The value keeps its first name, ``split``: objects
of earlier releases carry it.)"""
ANNOTATION_ABORT_SPLIT = f"{DOMAIN}/abort-split"
"""On a driver pod started to abort its shard's split: the children it fences and clears (``run --abort-split``)."""
ANNOTATION_ABORT_MERGE = f"{DOMAIN}/abort-merge"
"""On a merged shard's driver pod started to abort its merge (``run --abort-merge``): it fences the merged shard
and says whether a parent drained already."""
ANNOTATION_PRUNE_SHARDS = f"{DOMAIN}/prune-shards"
"""On a Task's prune pod (history retention): the retired shards whose recovery logs and snapshots it removes
(comma-separated); their TaskShards are deleted once it succeeded."""
ANNOTATION_MERGE_LEFT = f"{DOMAIN}/merge-left"
"""On the right shard of a merge: the left shard's name, the left shard's **claim** on it
(:mod:`taskshard_operator.handover`). Patched by the pass that accepts the merge, conditionally on the right
shard's resourceVersion, so the right shard cannot accept a hand-over of its own at the same moment."""
PROGRESS_PREFIX = DOMAIN

CONTAINER_DRIVER = "driver"
CONFIG_KEY = "shard.json"
CONFIG_DIR = "/etc/taskshard"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
EMITTING_FILE = "/tmp/taskshard-emitting"
"""Created by the runtime once the shard writes to its sink (a split child: once it took over); the driver
container's readiness probe tests it, so a TaskShard is Ready only while its shard emits."""
SPARK_AUTH_DIR = "/etc/taskshard-spark-auth"
SPARK_AUTH_KEY = "secret"
SPARK_AUTH_FILE = f"{SPARK_AUTH_DIR}/{SPARK_AUTH_KEY}"
"""The file of the shard's Spark authentication key in the driver and executor containers (a Secret volume)."""
READINESS_PERIOD_SECONDS = 2
HEARTBEAT_FILE = "/tmp/taskshard-heartbeat"
"""Touched by the runtime while its poll loop runs, absent while it starts, restores, waits on standby or drains;
the driver container's liveness probe fails when it is older than :data:`LIVENESS_STALE_MINUTES`."""
LIVENESS_STALE_MINUTES = 10
"""A driver whose poll loop has not run for this long (blocked in a storage call, a hung driver thread) is
restarted by its liveness probe; it resumes from its recovery log. Twice the default ``spec.noProgressSeconds``,
which shows it first (Degraded, NoProgress)."""
LIVENESS_PERIOD_SECONDS = 30


TASK_NAME_LIMIT = 63
"""A Task's name is at most 63 characters, a DNS label starting with a letter (CEL on the Task): it is the value
of the ``taskshard.io/task`` label on every object of the Task, and it starts its shards' Service names."""
TASK_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
SHARD_NAME_LIMIT = 47
"""A shard's name is at most 47 characters: it is the prefix of its executor pods' names (Spark allows 47), a
label value, and ``<shard>-driver-svc`` is a Service name (a DNS label of at most 63)."""
SHARD_NAME_DIGEST = 8
MERGE_FAMILY_DIGEST = 6


def shard_name(task: str, key_groups: KeyGroupRange, family: str | None = None) -> str:
    """``orders-0-64`` for task ``orders`` and ``[0, 64)``; ``orders-0-64-m1a2b3c`` in ``family`` ``m1a2b3c`` (a
    merged shard and the shards split from it, see :func:`merge_family`). When that would exceed
    :data:`SHARD_NAME_LIMIT`, the task part is cut and a digest of the full name keeps it unique:
    ``<task prefix>-<8 hex>-<start>-<end>[-<family>]``."""
    label = key_groups.label() if family is None else f"{key_groups.label()}-{family}"
    name = f"{task}-{label}"
    if len(name) <= SHARD_NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:SHARD_NAME_DIGEST]
    keep = SHARD_NAME_LIMIT - len(label) - SHARD_NAME_DIGEST - 2
    return f"{task[:keep].rstrip('-')}-{digest}-{label}"


def merge_family(left: str, right: str) -> str:
    """The family of the shard merged from ``left`` and ``right``: ``m`` and 6 hex digits of both names. A merged
    range's plain name may belong to an earlier shard (split, or merged, and kept as history), so a merged shard
    and every shard split from it carry the family in their names (label :data:`LABEL_FAMILY`): within a family
    splits only make smaller ranges, so its names never repeat."""
    return "m" + hashlib.sha256(f"{left}+{right}".encode()).hexdigest()[:MERGE_FAMILY_DIGEST]


def pod_name(shard: str) -> str:
    return f"{shard}-driver"


def configmap_name(shard: str) -> str:
    return f"{shard}-config"


def driver_service_name(shard: str) -> str:
    return f"{shard}-driver-svc"


def spark_auth_secret_name(shard: str) -> str:
    """The Secret holding the Spark authentication key of a shard that runs executors (driver and executors)."""
    return f"{shard}-spark-auth"


def cleanup_pod_name(task: str) -> str:
    return f"{task}-cleanup"


def prune_pod_name(task: str) -> str:
    return f"{task}-prune"


def disruption_budget_name(task: str) -> str:
    return f"{task}-shards"


def task_labels(task: str) -> dict[str, str]:
    return {LABEL_TASK: task}


def shard_labels(task: str, shard: str, key_groups: KeyGroupRange) -> dict[str, str]:
    """Labels of a TaskShard and of everything it owns (pod, ConfigMap)."""
    return {
        LABEL_TASK: task,
        LABEL_SHARD: shard,
        LABEL_KEY_GROUPS: key_groups.label(),
        LABEL_COMPONENT: COMPONENT_SHARD,
    }


def shard_selector(task: str) -> str:
    """A label selector for every TaskShard (and shard pod) of ``task``."""
    return f"{LABEL_TASK}={task},{LABEL_COMPONENT}={COMPONENT_SHARD}"
