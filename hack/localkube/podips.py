"""Pod IP addresses for the local node agent: each pod gets a loopback address of its own (test infrastructure).

Linux routes the whole of 127.0.0.0/8 to the loopback interface, so a process can bind and reach any 127.x.y.z
without any setup. A :class:`PodIPAllocator` hands out addresses from one block of that range (the node's "pod
CIDR"), the way a CNI plugin's IPAM would:

- Addresses are unique among the pods it holds them for; ``127.0.0.1`` (the node's own address, ``hostIP``) and
  the block's network and broadcast addresses are never handed out.
- It hands them out round-robin (the next free address after the last one handed out), so a released address is
  reused as late as possible.
- The caller releases a pod's address only when none of the pod's processes can still run (the node agent: when
  the pod's worker has finished, i.e. the pod is gone); until then no other pod gets it.
- ``allocate(uid, preferred)`` gives a pod the address it already reports (``status.podIP``, say after a restart
  of the agent) when that one is in the block and free, so a pod keeps its IP as in a real cluster.

The node agent's block is :func:`pool_for_api_port` unless ``--pod-cidr`` says otherwise: a /24 derived from the
API server's port, so that the agents of several local clusters running at once on one machine (each on its own
API port) never hand out the same address.
"""

from __future__ import annotations

import ipaddress
import threading

HOST_IP = "127.0.0.1"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class PodIPsExhausted(RuntimeError):
    """Every address of the block is held by a pod; the message names the block."""


def pool_for_api_port(api_port: int) -> str:
    """The node agent's default block: ``127.<port // 256>.<port % 256>.0/24`` (unique per API port)."""
    if not 0 < api_port < 65536:
        raise ValueError(f"API port {api_port} is not a TCP port")
    return f"127.{api_port >> 8}.{api_port & 0xFF}.0/24"


class PodIPAllocator:
    """Unique loopback addresses for pods, by pod UID. Thread-safe."""

    def __init__(self, cidr: str) -> None:
        net = ipaddress.ip_network(cidr, strict=False)
        if net.version != 4 or not net.subnet_of(LOOPBACK):
            raise ValueError(f"pod CIDR {cidr!r} is not inside 127.0.0.0/8 (pod IPs must be loopback addresses)")
        first, last = int(net.network_address), int(net.broadcast_address)
        if net.prefixlen <= 30:  # network and broadcast addresses are not handed out
            first, last = first + 1, last - 1
        self.cidr = str(net)
        self._first = first
        self._size = last - first + 1
        self._host = int(ipaddress.ip_address(HOST_IP))
        if self._size - (first <= self._host <= last) < 1:
            raise ValueError(f"pod CIDR {cidr!r} has no address to hand out")
        self._cursor = 0  # index of the next address to try
        self._by_uid: dict[str, str] = {}
        self._owner: dict[str, str] = {}
        self._lock = threading.Lock()

    def __contains__(self, ip: object) -> bool:
        """Whether ``ip`` is an address this allocator could hand out."""
        try:
            value = int(ipaddress.IPv4Address(str(ip)))
        except ValueError:
            return False
        return self._first <= value < self._first + self._size and value != self._host

    def allocate(self, uid: str, preferred: str | None = None) -> str:
        """The address of pod ``uid``: the one it holds already, else ``preferred`` if free, else the next free one.

        Raises :class:`PodIPsExhausted` when every address is held.
        """
        with self._lock:
            if uid in self._by_uid:
                return self._by_uid[uid]
            if preferred and preferred in self and preferred not in self._owner:
                return self._take(uid, preferred)
            for step in range(self._size):
                index = (self._cursor + step) % self._size
                value = self._first + index
                ip = str(ipaddress.IPv4Address(value))
                if value != self._host and ip not in self._owner:
                    self._cursor = (index + 1) % self._size
                    return self._take(uid, ip)
        raise PodIPsExhausted(f"no free pod IP in {self.cidr}: all {len(self._owner)} addresses are held by pods")

    def _take(self, uid: str, ip: str) -> str:
        self._by_uid[uid] = ip
        self._owner[ip] = uid
        return ip

    def release(self, uid: str) -> None:
        """Return pod ``uid``'s address to the block (a no-op when it holds none)."""
        with self._lock:
            ip = self._by_uid.pop(uid, None)
            if ip is not None:
                del self._owner[ip]

    def address_of(self, uid: str) -> str | None:
        with self._lock:
            return self._by_uid.get(uid)

    def held(self) -> dict[str, str]:
        """``{ip: uid}`` for every address held now (a copy)."""
        with self._lock:
            return dict(self._owner)
