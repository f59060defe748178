"""The operator's events are on the API server when the call that announced them returns (not queued for a
background poster an operator crash would lose: the scale test's fault injection kills the operator right after a
phase write, and the announcement of the step before must survive it)."""

from __future__ import annotations

import json

from kubernetes import config

from taskshard_operator.handlers import runtime
from taskshard_operator.kube import EVENT_COMPONENT, EVENT_MESSAGE_LIMIT, Kube


def test_an_event_is_posted_before_emit_returns(kube_cluster, kubectl, namespace, monkeypatch):
    api = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    monkeypatch.setattr(runtime.RUNTIME, "_kube", Kube(api))
    about = json.loads(kubectl("create", "configmap", "announced", "-o", "json").stdout)
    runtime.emit(about, "Normal", "ScalingDown", "m" * (EVENT_MESSAGE_LIMIT + 50))
    # No wait: the list right after the call must see it.
    items = json.loads(kubectl("get", "events", "-o", "json").stdout)["items"]
    (event,) = [e for e in items if e["reason"] == "ScalingDown"]
    assert event["involvedObject"]["name"] == "announced" and event["involvedObject"]["uid"] == about["metadata"]["uid"]
    assert event["involvedObject"]["kind"] == "ConfigMap" and event["type"] == "Normal"
    assert event["source"]["component"] == EVENT_COMPONENT and len(event["message"]) == EVENT_MESSAGE_LIMIT
    # A refused post (a namespace that does not exist) is logged; the caller goes on.
    runtime.emit({**about, "metadata": {**about["metadata"], "namespace": f"{namespace}-gone"}}, "Warning", "X", "y")
