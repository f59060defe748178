"""Runs one Pod's containers as local processes and reports their true status (test infrastructure).

A :class:`PodWorker` owns one pod (by UID) for its whole life on the node:

0. Address: before anything else the pod gets a loopback address of its own from the node's
   :class:`localkube.podips.PodIPAllocator` (the one it already reports, if that is free; a ``hostNetwork``
   pod gets the node's, ``127.0.0.1``). It is the pod's ``status.podIP``/``podIPs`` (``hostIP`` is
   ``127.0.0.1``), what the downward API's ``status.podIP`` resolves to, and where HTTP and TCP probes connect.
   While the block has no free address the pod stays Pending (``ContainerCreating`` with that message) and the
   worker retries every two seconds. The address is released when the worker finishes: the pod is gone and its
   processes were stopped.
1. Prepare: materialize volumes (:mod:`localkube.volumes`) and resolve each container's environment
   (:mod:`localkube.containerenv`). While a source is missing the pod stays Pending with a waiting reason
   (``CreateContainerConfigError``) and the worker retries every two seconds.
2. Init containers run one at a time, each to success, before the app containers start.
3. App containers start together, each through :mod:`localkube.podshim` in a private mount namespace with its
   volume mounts bound at their ``mountPath``, its termination-message file bound at
   ``terminationMessagePath`` and (unless ``hostNetwork``) the node's hosts file with the Service names at
   ``/etc/hosts`` (:mod:`localkube.clusterdns`). stdout and stderr are appended to
   ``<root>/logs/<ns>_<pod>_<container>.log``.
4. When a container exits, its terminated state (exit code, reason, message read from the termination-message
   file, start and finish times) is reported, and ``restartPolicy`` decides: Always restarts, OnFailure restarts
   on a non-zero code, Never leaves it. Restarts wait an exponential back-off (``CrashLoopBackOff``), which is
   reset after a container has run for ten minutes.
5. Probes (:mod:`localkube.probes`): a readiness probe decides the container's ``ready`` (and the pod's Ready
   condition); a failed liveness probe kills the container, which then restarts per ``restartPolicy``.
6. Deletion (``terminate``): SIGTERM to each running container, SIGKILL to its whole process group after the
   grace period, then the pod object is removed (delete with grace period 0, UID precondition).

Status is patched only when it changes, and only by this worker, so the API always shows what the processes do.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from .containerenv import EnvError, EnvResolver, base_environment, expand
from .fieldpath import with_addresses
from .kubeconfig import write_kubeconfig
from .podips import HOST_IP, PodIPAllocator, PodIPsExhausted
from .probes import Prober
from .volumes import VolumeError, VolumeMaterializer

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_MESSAGE = 4096
RESET_BACKOFF_AFTER = 600.0


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    """The live state of one container of the pod."""

    spec: dict
    init: bool = False
    proc: subprocess.Popen | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    restarts: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    done: bool = False  # terminated and not to be restarted
    next_start: float = 0.0
    ready: bool = False
    readiness: Prober | None = None
    liveness: Prober | None = None

    @property
    def name(self) -> str:
        return self.spec["name"]

    def status(self) -> dict:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"local://{self.proc.pid}" if self.proc else "",
            "ready": "running" in self.state and self.ready,
            "started": "running" in self.state,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodWorker(threading.Thread):
    """One thread per pod; see the module docstring for the life cycle."""

    def __init__(
        self,
        core,
        pod: dict,
        *,
        root: Path,
        api_host: str,
        api_port: int,
        ca_file: str,
        backoff_base: float,
        backoff_max: float,
        ips: PodIPAllocator,
        keep_visible: list[str] = (),
        hosts_file: Path | None = None,
    ) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.core = core
        self.pod = pod
        self.root = root
        self.api_host, self.api_port, self.ca_file = api_host, api_port, ca_file
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.ips = ips
        self.pod_ip: str | None = None  # assigned first thing in run()
        self.keep_visible = [*keep_visible, str(root)]
        self.hosts_file = hosts_file
        self.sandbox = root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        self.log_dir = root / "logs"
        self.volumes = VolumeMaterializer(core, root, self.sandbox, self._downward_pod())
        spec = pod["spec"]
        self.init_runs = [ContainerRun(c, init=True) for c in spec.get("initContainers") or []]
        self.runs = [ContainerRun(c) for c in spec.get("containers") or []]
        self._terminate = threading.Event()
        self._grace = 30.0
        self._last_status: str | None = None
        self._lock = threading.Lock()
        self.finished = threading.Event()

    # ----------------------------------------------------------------- public
    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def update_pod(self, pod: dict) -> None:
        """Take the newest pod object (annotations and labels feed downward-API volumes)."""
        with self._lock:
            self.pod = pod
            self.volumes.pod = self._downward_pod()

    def terminate(self, grace_seconds: float) -> None:
        """Stop the pod's containers (SIGTERM, then SIGKILL after ``grace_seconds``) and finalize deletion."""
        self._grace = max(0.0, grace_seconds)
        self._terminate.set()

    def _downward_pod(self) -> dict:
        """The pod as its downward API sees it: with this worker's addresses, whatever the API object says yet."""
        return with_addresses(self.pod, self.pod_ip, HOST_IP)

    def kill_now(self) -> None:
        """Stop every process at once (the pod object is already gone, or the agent is shutting down)."""
        for run in self.init_runs + self.runs:
            self._kill_group(run, signal.SIGKILL)

    # ----------------------------------------------------------------- thread body
    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - report, never die silently
            print(f"[node-agent] pod {self.key}: worker error: {e!r}", file=sys.stderr, flush=True)
            self.kill_now()
        finally:
            self.ips.release(self.pod["metadata"]["uid"])  # no process of the pod runs any more
            self.finished.set()

    def _run(self) -> None:
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        start_time = now_iso()
        if not self._assign_ip(start_time):
            return self._finalize_deletion()
        volume_paths = self._prepare(start_time)
        if volume_paths is None:
            return self._finalize_deletion()
        last_refresh = time.monotonic()
        for run in self.init_runs:
            while not run.done and not self._terminate.is_set():
                self._step(run, volume_paths)
                self._report(start_time)
                time.sleep(0.2)
            if self._failed(run):
                break
        while not self._terminate.is_set():
            if any(self._failed(r) for r in self.init_runs):
                break
            for run in self.runs:
                self._step(run, volume_paths)
            self._report(start_time)
            if all(r.done for r in self.runs):
                break
            if time.monotonic() - last_refresh > 2.0:
                last_refresh = time.monotonic()
                try:
                    with self._lock:
                        self.volumes.materialize()
                except (VolumeError, ApiException) as e:
                    print(f"[node-agent] pod {self.key}: volume refresh: {e}", file=sys.stderr, flush=True)
            time.sleep(0.2)
        if self._terminate.is_set():
            self._stop_containers()
            self._report(start_time)
            self._finalize_deletion()
            return
        self._report(start_time)
        # Terminal: wait for deletion so the object can be finalized.
        self._terminate.wait()
        self._finalize_deletion()

    # ----------------------------------------------------------------- steps
    def _assign_ip(self, start_time: str) -> bool:
        """Give the pod its address (see the module docstring); False when the pod was deleted meanwhile."""
        reported = (self.pod.get("status") or {}).get("podIP")
        while not self._terminate.is_set():
            try:
                if self.pod["spec"].get("hostNetwork"):
                    ip = HOST_IP  # as on a real node: a host-network pod's IP is the node's
                else:
                    ip = self.ips.allocate(self.pod["metadata"]["uid"], preferred=reported)
            except PodIPsExhausted as e:
                for run in self.init_runs + self.runs:
                    run.state = {"waiting": {"reason": "ContainerCreating", "message": str(e)}}
                self._report(start_time)
                self._terminate.wait(2.0)
                continue
            with self._lock:
                self.pod_ip = ip
                self.volumes.pod = self._downward_pod()
            print(f"[node-agent] pod {self.key}: pod IP {ip}", file=sys.stderr, flush=True)
            return True
        return False

    def _prepare(self, start_time: str) -> dict[str, Path] | None:
        while not self._terminate.is_set():
            try:
                with self._lock:
                    paths = self.volumes.materialize()
                return paths
            except (VolumeError, EnvError, ApiException) as e:
                reason = getattr(e, "reason", None) if isinstance(e, ApiException) else None
                for run in self.init_runs + self.runs:
                    run.state = {"waiting": {"reason": "CreateContainerConfigError", "message": reason or str(e)}}
                self._report(start_time)
                self._terminate.wait(2.0)
        return None

    def _failed(self, run: ContainerRun) -> bool:
        return run.done and run.state.get("terminated", {}).get("exitCode", 0) != 0

    def _policy_restarts(self, code: int, init: bool) -> bool:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if init:
            return code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _step(self, run: ContainerRun, volume_paths: dict[str, Path]) -> None:
        if run.done:
            return
        if run.proc is None:
            if time.monotonic() >= run.next_start:
                self._start(run, volume_paths)
            return
        code = run.proc.poll()
        if code is None:
            if time.monotonic() - run.started_mono > RESET_BACKOFF_AFTER:
                run.next_start = 0.0
            run.ready = run.readiness.tick(run.proc.pid) if run.readiness else True
            if run.liveness and not run.liveness.tick(run.proc.pid):
                print(
                    f"[node-agent] pod {self.key}: container {run.name} failed its liveness probe "
                    f"({run.liveness.last_error}); killing it",
                    file=sys.stderr,
                    flush=True,
                )
                self._kill_group(run, signal.SIGKILL)
            return
        run.ready = False
        self._kill_group(run, signal.SIGKILL)  # reap anything the container left behind
        run.state = {"terminated": self._terminated_state(run, code)}
        run.proc = None
        if self._policy_restarts(code, run.init):
            delay = min(self.backoff_max, self.backoff_base * (2 ** min(run.restarts, 16)))
            run.next_start = time.monotonic() + delay
            run.last_state = run.state
            run.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:.0f}s restarting failed container={run.name}",
                }
            }
            run.restarts += 1
        else:
            run.done = True

    def _terminated_state(self, run: ContainerRun, code: int) -> dict:
        if code < 0:  # killed by a signal
            code = 128 + (-code)
        state = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": now_iso(),
            "containerID": run.status()["containerID"],
        }
        message = (
            self._termination_file(run).read_bytes()[:MAX_MESSAGE].decode(errors="replace")
            if self._termination_file(run).exists()
            else ""
        )
        if not message and code != 0 and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            log = self._log_file(run)
            message = "\n".join(log.read_text(errors="replace").splitlines()[-80:])[-2048:] if log.exists() else ""
        if message:
            state["message"] = message
        return state

    def _termination_file(self, run: ContainerRun) -> Path:
        return self.sandbox / "containers" / run.name / "termination-log"

    def _log_file(self, run: ContainerRun) -> Path:
        meta = self.pod["metadata"]
        return self.log_dir / f"{meta['namespace']}_{meta['name']}_{run.name}.log"

    def _start(self, run: ContainerRun, volume_paths: dict[str, Path]) -> None:
        spec = run.spec
        cdir = self.sandbox / "containers" / run.name
        cdir.mkdir(parents=True, exist_ok=True)
        term = self._termination_file(run)
        term.write_bytes(b"")
        mounts = []
        for vm in spec.get("volumeMounts") or []:
            source = volume_paths.get(vm["name"])
            if source is None:
                run.state = {
                    "waiting": {
                        "reason": "CreateContainerConfigError",
                        "message": f"volumeMount {vm['name']!r}: no such volume",
                    }
                }
                run.next_start = time.monotonic() + 2
                return
            if vm.get("subPath"):
                source = source / vm["subPath"]
                if not source.exists():
                    source.mkdir(parents=True, exist_ok=True)
            mounts.append({"source": str(source), "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))})
        mounts.append(
            {
                "source": str(term),
                "target": spec.get("terminationMessagePath") or "/dev/termination-log",
                "readOnly": False,
            }
        )
        if self.hosts_file is not None and not self.pod["spec"].get("hostNetwork"):  # the DNS stand-in
            mounts.append({"source": str(self.hosts_file), "target": "/etc/hosts", "readOnly": True})
        kubeconfig = self._sa_kubeconfig(mounts)
        try:
            with self._lock:
                env = EnvResolver(
                    self.core,
                    self._downward_pod(),
                    base_environment(str(cdir), self.api_host, self.api_port, kubeconfig),
                ).resolve(spec)
        except (EnvError, ApiException) as e:
            run.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            run.next_start = time.monotonic() + 2
            return
        argv = [expand(a, env) for a in (spec.get("command") or []) + (spec.get("args") or [])]
        if not spec.get("command"):
            run.state = {
                "waiting": {
                    "reason": "CreateContainerError",
                    "message": "the local node agent cannot run an image's entrypoint: set command",
                }
            }
            run.next_start = time.monotonic() + 5
            return
        plan = cdir / "plan.json"
        plan.write_text(
            json.dumps(
                {
                    "mounts": mounts,
                    "cwd": spec.get("workingDir"),
                    "sandboxCwd": str(cdir),
                    "argv": argv,
                    "env": env,
                    "keepVisible": self.keep_visible,
                }
            )
        )
        log = open(self._log_file(run), "ab")  # noqa: SIM115 - handed to the child
        log.write(f"----- {now_iso()} start of {run.name} (restart {run.restarts}) -----\n".encode())
        log.flush()
        shim_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)}
        run.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "localkube.podshim", str(plan)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=shim_env,
        )
        log.close()
        run.started_at = now_iso()
        run.started_mono = time.monotonic()
        run.state = {"running": {"startedAt": run.started_at}}
        probe_host = self.pod_ip or HOST_IP
        run.readiness = (
            Prober(spec["readinessProbe"], spec, run.started_mono, False, probe_host)
            if spec.get("readinessProbe")
            else None
        )
        run.liveness = (
            Prober(spec["livenessProbe"], spec, run.started_mono, True, probe_host)
            if spec.get("livenessProbe")
            else None
        )

    def _sa_kubeconfig(self, mounts: list[dict]) -> str | None:
        """A kubeconfig that authenticates as the pod's service account, if its token is mounted.

        It is written as ``.kubeconfig`` inside the token volume itself, so the container finds it at
        ``<SA mount>/.kubeconfig`` whatever else its mounts hide (an emptyDir at ``/tmp``, say).
        """
        token_dir = next((m["source"] for m in mounts if m["target"] == SA_MOUNT), None)
        if token_dir is None:
            return None
        write_kubeconfig(
            Path(token_dir) / ".kubeconfig",
            f"https://{self.api_host}:{self.api_port}",
            f"{SA_MOUNT}/ca.crt",
            user="serviceaccount",
            token_file=f"{SA_MOUNT}/token",
            namespace=self.pod["metadata"]["namespace"],
        )
        return f"{SA_MOUNT}/.kubeconfig"

    def _kill_group(self, run: ContainerRun, sig: int) -> None:
        if run.proc is None:
            return
        try:
            os.killpg(run.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_containers(self) -> None:
        live = [r for r in self.init_runs + self.runs if r.proc is not None and r.proc.poll() is None]
        for run in live:
            try:
                run.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + self._grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in live):
            time.sleep(0.1)
        for run in live:
            if run.proc.poll() is None:
                self._kill_group(run, signal.SIGKILL)
                run.proc.wait()
            code = run.proc.returncode
            self._kill_group(run, signal.SIGKILL)
            run.state = {"terminated": self._terminated_state(run, code)}
            run.proc = None
            run.done = True
        for run in self.init_runs + self.runs:
            if not run.done:
                run.done = True

    def _finalize_deletion(self) -> None:
        meta = self.pod["metadata"]
        try:
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
        except ApiException as e:
            if e.status not in (404, 409):
                print(f"[node-agent] pod {self.key}: final delete failed: {e.reason}", file=sys.stderr, flush=True)

    # ----------------------------------------------------------------- status
    def _phase(self) -> str:
        runs = self.runs
        if any("running" in r.state for r in runs) or any(r.restarts and not r.done for r in runs):
            return "Running"
        if runs and all(r.done for r in runs):
            return "Succeeded" if all(not self._failed(r) for r in runs) else "Failed"
        if any(self._failed(r) for r in self.init_runs):
            return "Failed"
        return "Pending"

    def _report(self, start_time: str) -> None:
        phase = self._phase()
        ready = phase == "Running" and all("running" in r.state and r.ready for r in self.runs)
        initialized = all(r.done and not self._failed(r) for r in self.init_runs)
        t = now_iso()

        def cond(kind: str, ok: bool) -> dict:
            return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": t}

        status = {
            "phase": phase,
            "hostIP": HOST_IP,
            **({"podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}]} if self.pod_ip else {}),
            "startTime": start_time,
            "conditions": [
                cond("PodScheduled", True),
                cond("Initialized", initialized),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "containerStatuses": [r.status() for r in self.runs],
        }
        if self.init_runs:
            status["initContainerStatuses"] = [r.status() for r in self.init_runs]
        fingerprint = json.dumps({k: v for k, v in status.items() if k != "conditions"}, sort_keys=True) + json.dumps(
            [(c["type"], c["status"]) for c in status["conditions"]]
        )
        if fingerprint == self._last_status:
            return
        meta = self.pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
            self._last_status = fingerprint
        except ApiException as e:
            if e.status == 404:
                self._terminate.set()
                self._grace = 0
            else:
                print(f"[node-agent] pod {self.key}: status update failed: {e.reason}", file=sys.stderr, flush=True)
