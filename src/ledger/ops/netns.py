"""Machines of a test or drill, each in a network namespace of its own.

A ``Network`` is a Linux bridge in this (the root) namespace with one
address, ``Network.host``, where the services every machine shares listen:
a forwarder to PostgreSQL, the git server. Each ``Machine`` is a network
namespace (``ip netns``) joined to the bridge by a veth pair, with an
address of its own on the bridge's subnet and its own loopback: a process
run there (``Machine.command``) reaches this host's shared services at
``Network.host`` and nothing else of this host's networks -- not its
loopback, where the test's own servers and any other process listen.

Making namespaces takes root and ``ip`` (iproute2); ``available()`` says why
not when it cannot, and callers then run every machine on this host's
loopback instead (separate data dirs and homes still, sharing no path).
Names are random (several runs at once never collide) and ``close``
removes everything made.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from dataclasses import dataclass

#: Where bridge subnets are drawn from (a /24 each, avoiding any in use).
_POOL = ipaddress.IPv4Network("10.200.0.0/14")


def _ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def available() -> str | None:
    """``None`` if this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = f"lgprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except OSError as exc:
        return f"cannot make a network namespace: {exc}"
    try:
        _ip("netns", "del", probe)
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Machine:
    """One machine: a network namespace with an address on the bridge."""

    name: str
    netns: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run in this machine's network namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]


class Network:
    """A bridge with machines attached (see the module's docstring)."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"lgbr{self.tag}"
        self.subnet = self._free_subnet()
        hosts = list(self.subnet.hosts())
        self.host = str(hosts[0])
        self._next = 1
        self._hosts = hosts
        self.machines: list[Machine] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.host}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except OSError:
            self.close()
            raise

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        used: list[ipaddress.IPv4Network] = []
        for line in _ip("-o", "-4", "addr", "show").splitlines():
            words = line.split()
            if "inet" in words:
                used.append(ipaddress.IPv4Network(words[words.index("inet") + 1], strict=False))
        candidates = list(_POOL.subnets(new_prefix=24))
        random.shuffle(candidates)
        for subnet in candidates:
            if not any(subnet.overlaps(u) for u in used):
                return subnet
        raise OSError(f"no free /24 in {_POOL}")

    def machine(self, name: str) -> Machine:
        """A new machine called ``name``, attached to the bridge."""
        index = self._next
        self._next += 1
        netns = f"lg{self.tag}-{name}"[:40]
        outside, inside = f"lg{self.tag}h{index}", f"lg{self.tag}m{index}"
        address = str(self._hosts[index])
        _ip("netns", "add", netns)
        machine = Machine(name, netns, address)
        self.machines.append(machine)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inside, netns=netns)
        _ip("link", "set", inside, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        return machine

    def close(self) -> None:
        """Remove every machine (its veth pair goes with it) and the bridge."""
        for machine in self.machines:
            try:
                _ip("netns", "del", machine.netns)
            except OSError:
                pass
        self.machines = []
        try:
            _ip("link", "del", self.bridge)
        except OSError:
            pass

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
