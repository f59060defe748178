"""The watch-fed cache: Kopf indexes of Tasks, TaskShards, shard pods, shard ConfigMaps, executor pods and prune pods
``cache.py``).

Each index function is pure and returns ``{key: record}``; Kopf keeps the records up to date from its watches,
and no resource handler runs before every index was filled from a first listing. Kopf passes each index to every
handler as a kwarg named by its id; the startup handler hands them to ``KopfCache.bind`` (``settings.py``), which
takes every id of ``KopfCache.INDEXES``.
"""

from __future__ import annotations

from typing import Any

import kopf

from taskshard_operator import naming
from taskshard_operator import status as st
from taskshard_operator.cache import KopfCache, data_digest, object_record, shard_of, task_of
from taskshard_operator.executors import executor_view
from taskshard_operator.retention import prune_pod_view

SHARD_OBJECTS = {naming.LABEL_COMPONENT: naming.COMPONENT_SHARD}
EXECUTOR_PODS = {naming.LABEL_COMPONENT: naming.COMPONENT_EXECUTOR}
"""Executor pods a shard's driver created (``builders.build_executor_conf`` labels them)."""
PRUNE_PODS = {naming.LABEL_COMPONENT: naming.COMPONENT_PRUNE}
"""A Task's prune pod (history retention, ``builders.build_prune_pod``)."""


@kopf.index(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, id=KopfCache.SHARDS)
async def taskshard_by_name(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, name): object_record(body)}


@kopf.index(naming.DOMAIN, naming.API_VERSION, naming.SHARD_PLURAL, id=KopfCache.SHARDS_BY_TASK)
async def taskshards_by_task(namespace: str, body: kopf.Body, **_: Any) -> dict:
    task = task_of(body)
    return {(namespace, task): object_record(body)} if task else {}


@kopf.index(naming.DOMAIN, naming.API_VERSION, naming.TASK_PLURAL, id=KopfCache.TASKS)
async def task_by_name(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, name): object_record(body)}


@kopf.index("", "v1", "pods", labels=SHARD_OBJECTS, id=KopfCache.PODS)
async def shard_pod(namespace: str, body: kopf.Body, **_: Any) -> dict:
    shard = shard_of(body)
    return {(namespace, shard): st.pod_view(dict(body))} if shard else {}


@kopf.index("", "v1", "configmaps", labels=SHARD_OBJECTS, id=KopfCache.CONFIGMAPS)
async def shard_configmap(namespace: str, body: kopf.Body, **_: Any) -> dict:
    shard = shard_of(body)
    return {(namespace, shard): data_digest(body.get("data"))} if shard else {}


@kopf.index("", "v1", "pods", labels=EXECUTOR_PODS, id=KopfCache.EXECUTORS)
async def executor_pods(namespace: str, body: kopf.Body, **_: Any) -> dict:
    shard = shard_of(body)
    return {(namespace, shard): executor_view(dict(body))} if shard else {}


@kopf.index("", "v1", "pods", labels=PRUNE_PODS, id=KopfCache.PRUNE_PODS)
async def prune_pods(namespace: str, body: kopf.Body, **_: Any) -> dict:
    task = ((body.get("metadata") or {}).get("labels") or {}).get(naming.LABEL_TASK)
    return {(namespace, task): prune_pod_view(dict(body))} if task else {}
