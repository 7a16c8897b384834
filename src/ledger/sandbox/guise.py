"""How a judged run's cell looks from inside: an ordinary machine, drawn at
random for each run, never Ledger's.

A fix that is right only where it recognises its judge (``tail()`` right
only where ``/cell/work`` exists) passes every check that runs in a
recognisable place. So the cells that judge -- the verifier's acceptance
commands, held-out checks included, and a sensor's checks -- do not show a
fixed fingerprint: each run draws a ``Guise``, the checkout at a path that
looks like somebody's (a user's project directory, a service's or a CI
runner's), an ordinary host name, user name, uid and home, a machine id of
its own, and the cell's ``/etc/passwd``, ``/etc/group``, ``/etc/hostname``
and ``/etc/hosts`` to match. Nothing of it names Ledger.

Two families that share nothing -- no path prefix, user name, uid range or
host name pattern: the verifier's runs look like a developer's workstation
(``/home/<user>/<dir>/<project>``, ``<user>-laptop``, uid 1000-1999), a
sensor's like a server or a CI runner (``/srv``, ``/opt``, ``/builds``,
``/var/lib``, ``/workspace``; ``runner-3f9c2a``, ``ip-10-4-17-9``; uid
200-998 or 2000-2999). A fix keyed to what the verifier's runs look like
fails the sensor's confirming run, and the other way round; one keyed to
what they have in common (being in a cell at all) is what
docs/running/judging.md ("What is still possible") says remains.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

Family = Literal["verifier", "sensor"]

_RANDOM = random.SystemRandom()
_PEOPLE = ("alex", "sam", "kim", "jo", "maria", "chris", "dana", "lee", "nina", "omar", "pat", "rob",
           "yuki", "ana", "ben", "eva", "ivan", "li", "marta", "noah", "priya", "tom", "zoe", "jdoe",
           "dev", "mk", "andre", "sofia", "raj", "elena")
_PROJECT_DIRS = ("src", "code", "projects", "work", "git", "repos", "dev", "workspace", "Documents/code")
_MACHINES = ("laptop", "desktop", "workstation", "thinkpad", "xps", "mbp", "dev", "pc", "box", "tower")
_SERVICES = ("runner", "build", "ci", "deploy", "app", "svc", "worker", "jenkins", "buildkite", "agent")
_SERVICE_ROOTS = ("/srv/{svc}", "/opt/{svc}", "/builds/{group}", "/var/lib/{svc}/workspace",
                  "/workspace", "/var/lib/{svc}/builds/{token}/0/{group}", "/opt/{svc}/work")
_GROUPS = ("platform", "infra", "core", "backend", "team", "eng", "libs", "tools")
_WORDS = ("river", "maple", "cedar", "falcon", "otter", "quartz", "ember", "willow", "harbor", "comet")
#: What a project directory may be named after (a repository's name, if it is one).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class Guise:
    """One judged run's machine: where its checkout is, who it runs as."""

    family: Family
    checkout: str
    hostname: str
    user: str
    uid: int
    home: str
    #: directories of ``/tmp``-style names: for the judge's own files, for
    #: what a command may leave for the verifier to read
    scratch: str
    outputs: str
    machine_id: str

    @property
    def gid(self) -> int:
        return self.uid

    def environment(self) -> dict[str, str]:
        """The variables an ordinary login of this user has."""
        return {"HOME": self.home, "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash"}

    def passwd_line(self) -> str:
        return f"{self.user}:x:{self.uid}:{self.gid}:{self.user}:{self.home}:/bin/bash\n"

    def group_line(self) -> str:
        return f"{self.user}:x:{self.gid}:\n"

    def hosts(self) -> str:
        return (f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.hostname}\n"
                "::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")


def project_name(repository: str | None) -> str:
    """What a checkout of ``repository`` is called on an ordinary machine: its
    last path component without ``.git`` (a random word if that is no name)."""
    if repository:
        name = repository.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
        if _NAME.match(name) and "ledger" not in name.lower():
            return name
    return _RANDOM.choice(_WORDS)


def _hex(n: int) -> str:
    return "".join(_RANDOM.choice("0123456789abcdef") for _ in range(n))


def _tmp_name() -> str:
    letters = "abcdefghijklmnopqrstuvwxyz0123456789_"
    return "/tmp/tmp" + "".join(_RANDOM.choice(letters) for _ in range(8))


def draw(family: Family, project: str, *, taken_uids: frozenset[int] = frozenset(),
         taken_names: frozenset[str] = frozenset()) -> Guise:
    """A fresh guise of ``family`` for a checkout of ``project`` (see
    ``project_name``), avoiding the host's own uids and user names."""
    rng = _RANDOM
    if family == "verifier":
        user = rng.choice([p for p in _PEOPLE if p not in taken_names] or ["alex"])
        uid = rng.choice([u for u in range(1000, 2000) if u not in taken_uids])
        home = f"/home/{user}"
        checkout = f"{home}/{rng.choice(_PROJECT_DIRS)}/{project}"
        hostname = rng.choice((f"{user}-{rng.choice(_MACHINES)}", f"{rng.choice(_WORDS)}",
                               f"{user}s-{rng.choice(_MACHINES)}", f"{rng.choice(_MACHINES)}-{rng.randint(1, 99)}"))
    else:
        user = rng.choice([s for s in _SERVICES if s not in taken_names] or ["runner"])
        uid = rng.choice([u for u in (*range(200, 999), *range(2000, 3000)) if u not in taken_uids])
        home = rng.choice((f"/var/lib/{user}", f"/srv/{user}", f"/opt/{user}"))
        root = rng.choice(_SERVICE_ROOTS).format(svc=user, group=rng.choice(_GROUPS), token=_hex(8))
        checkout = f"{root}/{project}"
        hostname = rng.choice((f"runner-{_hex(6)}", f"ip-10-{rng.randint(0, 255)}-{rng.randint(0, 255)}-"
                               f"{rng.randint(1, 254)}", f"build{rng.randint(1, 40)}",
                               f"{rng.choice(_WORDS)}-{_hex(5)}", f"ci-{rng.choice(_WORDS)}-{rng.randint(1, 9)}"))
    return Guise(family=family, checkout=checkout, hostname=hostname, user=user, uid=uid, home=home,
                 scratch=_tmp_name(), outputs=_tmp_name(), machine_id=_hex(32))
