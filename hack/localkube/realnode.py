"""A real Kubernetes node on this host for the local control plane: containerd and runc, a CNI bridge, the
kubelet, kube-proxy and CoreDNS (the real-node tier, ``make test-node``).

The node agent (:mod:`localkube.nodeagent`) runs pods as local processes with the host's Python; this node runs
images as containers, so the user id, the read-only root filesystem, memory limits and the pod network are the
container runtime's, as on any cluster.

Contract:

- Start the control plane with ``LocalCluster(..., node_agent=False, apiserver_flags=RealNode.apiserver_flags())``:
  the apiserver then listens on every address and advertises the node's IP, so pods reach it through the
  ``kubernetes`` Service (kube-proxy's rules), and it reaches the kubelet by InternalIP.
- ``RealNode(cluster, run_dir).start()`` returns once the node is Ready. It needs root, Debian's containerd, runc,
  CNI plugins and iptables (installed with apt-get when missing), a C compiler (the pause image) and the kubelet,
  kube-proxy and CoreDNS of ``hack/build-binaries.sh node`` (built when missing). CoreDNS serves the cluster's
  names (``<service>.<namespace>.svc``, which Spark executors use to reach their driver) on the node's IP, port
  53. Failing any of that raises :class:`~localkube.hostnode.NodeUnavailable` with the reason.
- ``import_image(archive)`` loads a ``docker save`` archive into the node's image store (pods then use the image
  with ``imagePullPolicy: IfNotPresent`` or ``Never``; nothing is pulled from a registry).
- ``stop()`` deletes every pod, stops kube-proxy, the kubelet and containerd, and undoes what the node changed on
  the host (:mod:`localkube.hostnode`): iptables chains, the bridge, sysctls, cgroups, mounts. Safe to call twice.

The image store lives in the run directory and is removed at stop (a run imports its images afresh, ~45 s for
both); only the pause image's archive is cached, in ``~/.cache/taskshard/node`` (``TASKSHARD_NODE_CACHE``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from localkube import hostnode
from localkube.binaries import NodeBinaries, ensure_node_binaries
from localkube.cluster import LocalCluster, free_port
from localkube.kubeconfig import write_kubeconfig
from localkube.ociimage import ensure_pause_image
from localkube.pki import issue_client_cert

NODE_NAME = "taskshard-node"
POD_CIDR = "10.244.0.0/24"
BRIDGE = "tsnode0"
CNI_NETWORK = "taskshard-node"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
STATE_DIR = Path("/run/taskshard-node")  # short: unix socket paths are limited to 108 bytes
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for CRI images and containers


def cache_dir() -> Path:
    return Path(os.environ.get("TASKSHARD_NODE_CACHE", Path.home() / ".cache" / "taskshard" / "node"))


class RealNode:
    """containerd + kubelet + kube-proxy for ``cluster``; see the module docstring for the contract."""

    def __init__(self, cluster: LocalCluster, run_dir: Path, *, node_name: str = NODE_NAME) -> None:
        self.cluster = cluster
        self.run_dir = Path(run_dir).resolve()
        self.node_name = node_name
        self.ip = hostnode.node_ip()
        self.containerd_root = self.run_dir / "containerd"
        self.socket = STATE_DIR / "containerd.sock"
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._saved_sysctls: dict[str, str] = {}
        self.binaries: NodeBinaries | None = None
        self.kubelet_port = free_port()

    @staticmethod
    def apiserver_flags() -> list[str]:
        ip = hostnode.node_ip()
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={ip}",
            "--endpoint-reconciler-type=lease",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]

    # ----------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 120.0) -> RealNode:
        hostnode.ensure_host_packages()
        self.binaries = ensure_node_binaries()
        for sub in ("logs", "kubelet", "pod-logs", "cni"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        self._saved_sysctls = hostnode.read_sysctls()
        hostnode.write_sysctls({"net/ipv4/ip_forward": "1"})
        try:
            self._start_containerd()
            self.import_image(ensure_pause_image(PAUSE_IMAGE, cache_dir()))
            self._start_coredns()
            self._start_kubelet()
            self._start_kube_proxy()
            self._wait("node Ready", self._node_ready, timeout)
        except BaseException:
            self.print_log_tails()
            self.stop()
            raise
        return self

    def import_image(self, archive: Path) -> None:
        """Load a ``docker save`` archive (one or more tagged images) into the node's image store."""
        self._ctr("images", "import", str(archive))

    def stop(self) -> None:
        if not self._procs and not self._saved_sysctls:
            return
        self._delete_pods()
        proxy = self._take("kube-proxy")
        if proxy is not None:
            self._terminate(proxy)
            assert self.binaries is not None
            subprocess.run([self.binaries.kube_proxy, "--cleanup"], capture_output=True, check=False)
        for name in ("kubelet", "coredns"):
            proc = self._take(name)
            if proc is not None:
                self._terminate(proc)
        if self.socket.exists():
            self._kill_containers()
        containerd = self._take("containerd")
        if containerd is not None:
            self._terminate(containerd)
        hostnode.kill_processes_mentioning(str(self.socket))  # shims outlive containerd
        hostnode.unmount_under(self.run_dir / "kubelet", STATE_DIR, self.containerd_root)
        shutil.rmtree(self.containerd_root, ignore_errors=True)  # the images: gigabytes, imported again each run
        hostnode.remove_cni_chains(CNI_NETWORK)
        hostnode.delete_link(BRIDGE)
        hostnode.remove_cgroups()
        hostnode.write_sysctls(self._saved_sysctls)
        self._saved_sysctls = {}

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- components
    def _start_containerd(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.containerd_root.mkdir(parents=True, exist_ok=True)
        cni_conf = self.run_dir / "cni" / "conf"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-taskshard.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = self.run_dir / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{self.containerd_root}"
state = "{STATE_DIR}/state"
[grpc]
  address = "{self.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: containers may not lower their OOM score below the runtime's
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{hostnode.CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
"""
        )
        self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait("containerd", lambda: self._ctr_ok("version"), 60)

    def _cni_config(self) -> dict:
        return {
            "cniVersion": "0.4.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.run_dir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _start_coredns(self) -> None:
        assert self.binaries is not None
        corefile = self.run_dir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {self.ip}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 5
}}
"""
        )
        self._spawn("coredns", [self.binaries.coredns, "-conf", str(corefile)])

    def _start_kubelet(self) -> None:
        assert self.cluster.pki is not None and self.binaries is not None
        cert, key = issue_client_cert(self.cluster.pki, "kubelet", f"system:node:{self.node_name}", "system:nodes")
        kubeconfig = self.run_dir / "kubelet" / "kubeconfig"
        write_kubeconfig(kubeconfig, self.cluster.server, self.cluster.pki.ca_crt, user="kubelet", cert=cert, key=key)
        # The node's own identity may write its Node and read its pods' Secrets and ConfigMaps.
        self.cluster.kubectl(
            "create", "clusterrolebinding", "taskshard-node", "--clusterrole=system:node", "--group=system:nodes"
        )
        config = self.run_dir / "kubelet" / "config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()))
        self._spawn(
            "kubelet",
            [
                self.binaries.kubelet,
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.run_dir / 'kubelet' / 'root'}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.ip}",
                "--v=1",
            ],
        )

    def _kubelet_config(self) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.run_dir / "pod-logs"),
            "address": self.ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            # The apiserver calls the kubelet (logs, exec) without a client certificate: a test bed's shortcut.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": "cluster.local",
            "clusterDNS": [self.ip],
            # A shared test machine: evict only when it is really short, never garbage-collect the images.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "podCIDR": POD_CIDR,
        }

    def _start_kube_proxy(self) -> None:
        assert self.binaries is not None
        config = self.run_dir / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
                    "mode": "iptables",
                    "hostnameOverride": self.node_name,
                    "clusterCIDR": POD_CIDR,
                    "bindAddress": self.ip,
                    "healthzBindAddress": f"127.0.0.1:{free_port()}",
                    "metricsBindAddress": f"127.0.0.1:{free_port()}",
                    # leave the host's conntrack table sizes alone
                    "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
                }
            )
        )
        self._spawn("kube-proxy", [self.binaries.kube_proxy, f"--config={config}", "--v=1"])

    # ----------------------------------------------------------------- teardown helpers
    def _delete_pods(self) -> None:
        """Delete every pod and wait (60 s at most) until the runtime runs none, so the CNI tears down each."""
        if self.cluster.server:
            self.cluster.kubectl(
                "delete", "pods", "--all", "--all-namespaces", "--grace-period=5", "--wait=false", check=False
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self._running_tasks():
                time.sleep(1)

    def _running_tasks(self) -> list[str]:
        if not self.socket.exists():
            return []
        lines = self._ctr("tasks", "list", check=False).splitlines()[1:]
        return [line.split()[0] for line in lines if "RUNNING" in line]

    def _kill_containers(self) -> None:
        for task in self._running_tasks():
            self._ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)

    # ----------------------------------------------------------------- plumbing
    def _ctr(self, *args: str, check: bool = True) -> str:
        cmd = ["ctr", "--address", str(self.socket), "--namespace", K8S_NAMESPACE, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {result.returncode}): {result.stderr.strip()[-500:]}")
        return result.stdout

    def _ctr_ok(self, *args: str) -> bool:
        return self.socket.exists() and self._ctr(*args, check=False) != ""

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.run_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append((name, proc))

    def _take(self, name: str) -> subprocess.Popen | None:
        for i, (each, proc) in enumerate(self._procs):
            if each == name:
                del self._procs[i]
                return proc
        return None

    @staticmethod
    def _terminate(proc: subprocess.Popen, grace: float = 20.0) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _node_ready(self) -> bool:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise hostnode.NodeUnavailable(f"{name} exited with status {proc.returncode} while the node started")
        out = self.cluster.kubectl(
            "get",
            "node",
            self.node_name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.stdout.strip() == "True"

    def _wait(self, what: str, probe, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if probe():
                return
            time.sleep(0.5)
        raise hostnode.NodeUnavailable(f"{what}: not within {timeout:.0f}s (logs in {self.run_dir / 'logs'})")

    def print_log_tails(self, lines: int = 30) -> None:
        for log in sorted((self.run_dir / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(f"----- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)
