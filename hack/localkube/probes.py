"""Liveness, readiness and startup probes for the local node agent, with a kubelet's timing rules.

A :class:`Prober` runs one probe (``httpGet``, ``tcpSocket`` or ``exec``) of one running container. Call
``tick(pid)`` often; it probes when ``initialDelaySeconds`` and ``periodSeconds`` say so and returns the current
verdict: ``True`` after ``successThreshold`` consecutive successes, ``False`` after ``failureThreshold``
consecutive failures, unchanged in between. As a kubelet does, ``httpGet`` and ``tcpSocket`` probes connect to
the pod's IP (its own loopback address, see :mod:`localkube.podips`) unless the probe sets ``host``; HTTP probes
never go through a proxy (``http_proxy`` and friends are ignored). ``exec`` probes run inside the container's
mount namespace (``nsenter``).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def _port(value, container: dict) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"probe port {value!r} is not a container port name")


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Prober:
    def __init__(self, probe: dict, container: dict, started: float, initial: bool, host: str) -> None:
        """``host``: the pod's IP, where HTTP and TCP probes go unless they set their own ``host``."""
        self.probe = probe
        self.container = container
        self.host = host
        self.period = float(probe.get("periodSeconds") or 10)
        self.timeout = float(probe.get("timeoutSeconds") or 1)
        self.success_threshold = int(probe.get("successThreshold") or 1)
        self.failure_threshold = int(probe.get("failureThreshold") or 3)
        self.next_at = started + float(probe.get("initialDelaySeconds") or 0)
        self.verdict = initial
        self.successes = 0
        self.failures = 0
        self.last_error = ""

    def tick(self, pid: int) -> bool:
        now = time.monotonic()
        if now < self.next_at:
            return self.verdict
        self.next_at = now + self.period
        ok = self._run(pid)
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.success_threshold:
                self.verdict = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.failure_threshold:
                self.verdict = False
        return self.verdict

    def _run(self, pid: int) -> bool:
        try:
            if "httpGet" in self.probe:
                spec = self.probe["httpGet"]
                host = _url_host(spec.get("host") or self.host)
                url = f"http://{host}:{_port(spec['port'], self.container)}{spec.get('path', '/')}"
                with _NO_PROXY.open(url, timeout=self.timeout) as response:
                    return 200 <= response.status < 400
            if "tcpSocket" in self.probe:
                spec = self.probe["tcpSocket"]
                port = _port(spec["port"], self.container)
                with socket.create_connection((spec.get("host") or self.host, port), timeout=self.timeout):
                    return True
            if "exec" in self.probe:
                cmd = ["nsenter", "-t", str(pid), "-m", "--", *self.probe["exec"]["command"]]
                return subprocess.run(cmd, capture_output=True, timeout=self.timeout).returncode == 0
            self.last_error = f"unsupported probe {sorted(self.probe)}"
        except (OSError, urllib.error.URLError, subprocess.TimeoutExpired, ValueError) as e:
            self.last_error = str(e)
        return False
