"""Operator settings: the ``taskshard.io`` finalizer and annotation storage, event posting, peering defaults."""

from __future__ import annotations

import logging

import kopf

from taskshard_operator import naming
from taskshard_operator.handlers.runtime import RUNTIME


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.finalizer = naming.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.PROGRESS_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=naming.PROGRESS_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # log lines are not events; the reconcilers post their own
    settings.peering.stealth = True
    settings.execution.max_workers = 16
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    RUNTIME.kube  # noqa: B018 - load credentials once, at start


@kopf.on.probe(id="api")
def operator_probe(**_) -> str:
    return "ok"
