"""The local node agent: TEST INFRASTRUCTURE that stands in for a kubelet on the local control plane.

It is not a kubelet and not part of the product. It lets the tests and the demo run real Pods on a machine where
no container runtime can pull images: a Pod's containers run as local processes of this machine (the image name
is recorded, never pulled; ``command`` must be set). What it does:

- Registers a Node (``--node-name``) with generous allocatable resources (it oversubscribes on purpose), keeps it
  Ready with a node Lease and status heartbeats every 10 s.
- Watches the Pods bound to that node and runs each with a :class:`localkube.podworker.PodWorker` (volumes,
  environment, service-account credentials, restart policy with back-off, probes, termination messages,
  graceful deletion). Every container's stdout and stderr is in ``<root>/logs/<namespace>_<pod>_<container>.log``.
- Gives each pod an IP of its own, as a kubelet with a CNI plugin does: a loopback address from the node's pod
  CIDR (``--pod-cidr``; by default ``127.<P // 256>.<P % 256>.0/24`` for API port ``P``, so concurrent local
  clusters never share one), never ``127.0.0.1`` (but a ``hostNetwork`` pod's IP is the node's, as on a real
  node), see :mod:`localkube.podips`. It is decided before the pod's containers start and is the pod's
  ``status.podIP``/``podIPs``, the downward API's ``status.podIP`` and the target of its HTTP and TCP probes;
  it is released, for another pod to reuse, only when the pod is gone and its processes stopped. The node's
  ``hostIP`` (and ``InternalIP``) is ``127.0.0.1``. Containers share the host's network namespace: a process
  binding ``0.0.0.0`` is reachable on its pod IP (and on every other, and holds that port on all of them).
- Acts as a local-path provisioner: each Pending PersistentVolumeClaim gets a hostPath PersistentVolume at
  ``<root>/pvc/<namespace>/<claim>``, bound to it by the controller-manager as usual.
- Stands in for cluster DNS: Service names resolve through each pod's ``/etc/hosts`` to the Service's endpoint
  addresses (:mod:`localkube.clusterdns`).
- On SIGTERM it stops every pod's processes (SIGTERM, then SIGKILL after 5 s) and exits.

Run: ``python -m localkube.nodeagent --kubeconfig K --node-name N --root DIR --api-host H --api-port P``
(optionally ``--pod-cidr 127.A.B.0/24``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import sys
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from .clusterdns import ClusterHosts
from .podips import HOST_IP, PodIPAllocator, pool_for_api_port
from .podworker import PodWorker
from .volumes import pvc_dir

HEARTBEAT_SECONDS = 10


def log(message: str) -> None:
    print(f"[node-agent {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeAgent:
    def __init__(self, args: argparse.Namespace) -> None:
        config.load_kube_config(config_file=args.kubeconfig)
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.node = args.node_name
        self.root = Path(args.root)
        self.args = args
        self.workers: dict[str, PodWorker] = {}
        self.ips = PodIPAllocator(args.pod_cidr or pool_for_api_port(args.api_port))
        self.stopping = threading.Event()
        self.hosts = ClusterHosts(self.api, self.root / "hosts")

    # ----------------------------------------------------------------- node
    def node_status(self) -> dict:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {"cpu": self.args.cpu, "memory": self.args.memory, "pods": "110", "ephemeral-storage": "100Gi"}
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "LocalAgentReady",
            "message": "local node agent is posting ready status",
            "lastHeartbeatTime": now,
        }
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [ready]
            + [
                {"type": t, "status": "False", "reason": f"No{t}", "lastHeartbeatTime": now}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ],
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": self.node}],
            "nodeInfo": {
                "kubeletVersion": "localkube",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "local-process://1",
                "kernelVersion": "",
                "osImage": "local",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        }

    def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "taskshard.io/local-node-agent": "true",
                },
            },
        }
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        self.core.patch_node_status(self.node, {"status": self.node_status()})
        log(f"registered node {self.node}; pod IPs from {self.ips.cidr}")

    def heartbeat_loop(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            try:
                self.core.patch_node_status(self.node, {"status": self.node_status()})
                self._renew_lease()
            except Exception as e:  # noqa: BLE001 - keep beating
                log(f"heartbeat failed: {e!r}")

    def _renew_lease(self) -> None:
        lease = {
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro_now()},
        }
        try:
            self.coordination.patch_namespaced_lease(self.node, "kube-node-lease", lease)
        except ApiException as e:
            if e.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", lease)

    # ----------------------------------------------------------------- volumes
    def provision_loop(self) -> None:
        """Give each Pending PVC a hostPath PV of its own (deterministic name ``pvc-<uid>``)."""
        while not self.stopping.wait(1.0):
            try:
                for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
                    if pvc.status.phase == "Pending" and not pvc.spec.volume_name:
                        self._provision(pvc)
            except Exception as e:  # noqa: BLE001
                log(f"provisioner: {e!r}")

    def _provision(self, pvc) -> None:
        ns, name = pvc.metadata.namespace, pvc.metadata.name
        path = pvc_dir(self.root, ns, name)
        path.mkdir(parents=True, exist_ok=True)
        size = (pvc.spec.resources.requests or {}).get("storage", "1Gi") if pvc.spec.resources else "1Gi"
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{pvc.metadata.uid}", "labels": {"taskshard.io/local-node-agent": "true"}},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": pvc.spec.access_modes or ["ReadWriteOnce"],
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": pvc.spec.storage_class_name or "",
                "claimRef": {"namespace": ns, "name": name, "uid": pvc.metadata.uid},
            },
        }
        try:
            self.core.create_persistent_volume(body)
            log(f"provisioned {path} for pvc {ns}/{name}")
        except ApiException as e:
            if e.status != 409:
                raise

    # ----------------------------------------------------------------- pods
    def handle(self, pod: dict) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        worker = self.workers.get(uid)
        if worker is None:
            if meta.get("deletionTimestamp") and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                worker = self._new_worker(pod, start=False)
                worker._finalize_deletion()
                return
            worker = self._new_worker(pod, start=True)
        else:
            worker.update_pod(pod)
        if meta.get("deletionTimestamp"):
            worker.terminate(float(meta.get("deletionGracePeriodSeconds") or 0))

    def _new_worker(self, pod: dict, start: bool) -> PodWorker:
        worker = PodWorker(
            self.core,
            pod,
            root=self.root,
            api_host=self.args.api_host,
            api_port=self.args.api_port,
            ca_file="",
            backoff_base=self.args.backoff_base,
            backoff_max=self.args.backoff_max,
            ips=self.ips,
            keep_visible=self.args.keep_visible,
            hosts_file=self.hosts.path,
        )
        if start:
            self.workers[pod["metadata"]["uid"]] = worker
            log(f"starting pod {worker.key}")
            worker.start()
        return worker

    def forget(self, uid: str) -> None:
        """The pod object is gone: stop its processes at once and drop its worker."""
        worker = self.workers.pop(uid, None)
        if worker is not None and not worker.finished.is_set():
            log(f"pod {worker.key} is gone: stopping its processes")
            worker.terminate(0)
            worker.kill_now()

    def forget_missing(self, present: set[str]) -> None:
        for uid, worker in list(self.workers.items()):
            if uid not in present:
                self.forget(uid)
            elif worker.finished.is_set():
                del self.workers[uid]

    def watch_loop(self) -> None:
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(field_selector=selector)
                present = set()
                for item in listing.items:
                    pod = self.api.sanitize_for_serialization(item)
                    present.add(pod["metadata"]["uid"])
                    self.handle(pod)
                self.forget_missing(present)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=30,
                )
                for event in stream:
                    if self.stopping.is_set():
                        break
                    pod = self.api.sanitize_for_serialization(event["object"])
                    if event["type"] == "DELETED":
                        self.forget(pod["metadata"]["uid"])
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self.handle(pod)
            except Exception as e:  # noqa: BLE001 - relist and go on
                if not self.stopping.is_set():
                    log(f"pod watch: {e!r}; relisting")
                    time.sleep(1)

    def shutdown(self) -> None:
        self.stopping.set()
        for worker in self.workers.values():
            worker.terminate(5)
        deadline = time.monotonic() + 10
        for worker in self.workers.values():
            worker.finished.wait(max(0.1, deadline - time.monotonic()))
            worker.kill_now()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="localkube.nodeagent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", default="localnode")
    parser.add_argument("--root", required=True, help="directory for pod sandboxes, logs and PVC data")
    parser.add_argument("--api-host", default="127.0.0.1")
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument(
        "--pod-cidr",
        help="the block inside 127.0.0.0/8 pod IPs come from (default: 127.<port // 256>.<port % 256>.0/24 "
        "for the API port, unique among local clusters running at once)",
    )
    parser.add_argument("--cpu", default="32", help="CPU the node advertises (oversubscribed on purpose)")
    parser.add_argument("--memory", default="128Gi", help="memory the node advertises")
    parser.add_argument("--backoff-base", type=float, default=1.0, help="first restart back-off, seconds")
    parser.add_argument("--backoff-max", type=float, default=60.0, help="longest restart back-off, seconds")
    parser.add_argument(
        "--keep-visible",
        action="append",
        default=[],
        help="a host directory containers must always see, even under a volume mounted over one of its parents "
        "(the Python environment and project the pods run: what an image would hold); repeatable",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    agent = NodeAgent(parse_args(argv))
    agent.root.mkdir(parents=True, exist_ok=True)
    done = threading.Event()

    def on_signal(*_):
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.register()
    for target in (agent.heartbeat_loop, agent.provision_loop, agent.watch_loop):
        threading.Thread(target=target, daemon=True, name=target.__name__).start()
    threading.Thread(target=agent.hosts.loop, args=(agent.stopping,), daemon=True, name="cluster_dns").start()
    done.wait()
    log("stopping: terminating pods")
    agent.shutdown()
    log("stopped")


if __name__ == "__main__":
    main()
