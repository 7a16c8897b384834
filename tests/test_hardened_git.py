"""Ledger's own git never runs code a repository, a user or the system
configured (``ledger.git.hardened_git``).

Each test plants programs everywhere git looks for them -- every hook, a hooks
path in the repository, in ``$HOME/.gitconfig`` and in a system config, a
fsmonitor, clean/smudge/process filters, diff textconv and external diff,
merge drivers (selected by a committed ``.gitattributes``), a pager, an
editor, credential helpers, ``remote.*.uploadpack``, signing programs, an
``include.path`` pulling in more of them -- each program writing a marker
when it runs. Then it drives the git steps Ledger takes (commits of
candidates, checkouts for verification, promotion into a checked-out branch,
rebases, retention) through ``ledger.git.repository`` and checks that no marker
was written. A control test shows that the same plants do run under plain git,
so the check can fail.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.git import hardened_git
from ledger.git import repository as repositories
from ledger.git.repository import Repository

HOOKS = ("applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
         "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
         "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
         "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc",
         "post-rewrite", "sendemail-validate", "fsmonitor-watchman", "p4-changelist",
         "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit", "post-index-change")


def plain_git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Git as a user runs it (their configuration and all): for building
    fixtures and for the control test."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Plants:
    """A program that records it ran, and the places it was planted."""

    def __init__(self, root: Path):
        self.markers = root / "markers"
        self.markers.mkdir()
        self.bin = root / "evil-bin"
        self.bin.mkdir()
        self.program = self.bin / "evil"
        # A filter must pass content through, or git fails before the test can
        # see whether the filter ran; every other use just records and exits 0.
        self.program.write_text(
            "#!/bin/sh\n"
            f'touch "{self.markers}/$(basename "$0")-$$"\n'
            'cat 2>/dev/null || true\n'
            "exit 0\n")
        self.program.chmod(0o755)
        self.hooks = root / "evil-hooks"
        self.hooks.mkdir()
        for hook in HOOKS:
            target = self.hooks / hook
            target.write_text(f'#!/bin/sh\ntouch "{self.markers}/hook-{hook}-$$"\nexit 0\n')
            target.chmod(0o755)

    def ran(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())

    def config_lines(self) -> str:
        p = self.program
        return "\n".join([
            "[core]", f"\thooksPath = {self.hooks}", f"\tfsmonitor = {p}", f"\tpager = {p}",
            f"\teditor = {p}", f"\tsshCommand = {p}", f"\taskPass = {p}",
            f"\talternateRefsCommand = {p}",
            "[credential]", f"\thelper = !{p}",
            "[filter \"evil\"]", f"\tclean = {p}", f"\tsmudge = {p}", f"\tprocess = {p}",
            "\trequired = true",
            "[diff]", f"\texternal = {p}",
            "[diff \"evil\"]", f"\ttextconv = {p}", f"\tcommand = {p}",
            "[merge \"evil\"]", f"\tdriver = {p} %O %A %B",
            "[gpg]", f"\tprogram = {p}",
            "[commit]", "\tgpgSign = true",
            "[sequence]", f"\teditor = {p}",
            "[uploadpack]", f"\tpackObjectsHook = {p}",
            "[gc]", "\tauto = 1", "\tautoDetach = false",
            "",
        ])

    def plant_repository(self, git_dir: Path) -> None:
        """Hooks in ``git_dir/hooks`` and every program key in its config,
        half of them through an ``include.path``."""
        hooks = git_dir / "hooks"
        hooks.mkdir(exist_ok=True)
        for hook in self.hooks.iterdir():
            (hooks / hook.name).write_bytes(hook.read_bytes())
            (hooks / hook.name).chmod(0o755)
        included = git_dir / "included.config"
        included.write_text(self.config_lines())
        with open(git_dir / "config", "a") as config:
            config.write(f"[include]\n\tpath = {included}\n")
            config.write(f"[remote \"origin\"]\n\tuploadpack = {self.program}\n"
                         f"\treceivepack = {self.program}\n")
            config.write(f"[core]\n\tfsmonitor = {self.program}\n")


@pytest.fixture
def plants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plants]:
    found = Plants(tmp_path)
    # The user's own configuration and a system configuration: both planted.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(found.config_lines())
    system = tmp_path / "system.gitconfig"
    system.write_text(found.config_lines())
    xdg = tmp_path / "xdg"
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "config").write_text(found.config_lines())
    (xdg / "git" / "attributes").write_text("* filter=evil diff=evil merge=evil\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(system))
    monkeypatch.setenv("EDITOR", str(found.program))
    monkeypatch.setenv("GIT_PAGER", str(found.program))
    yield found


def _seed(tmp_path: Path, name: str, *, bare: bool) -> Path:
    """A repository with two commits on main and a ``.gitattributes`` that
    selects the evil filter, diff and merge drivers for every file (built
    before anything is planted, with a clean configuration)."""
    clean = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    seed = tmp_path / f"{name}-seed"
    plain_git(tmp_path, "init", "--quiet", "--initial-branch=main", str(seed), env=clean)
    (seed / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    (seed / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (seed / "tests").mkdir()
    (seed / "tests" / "test_app.py").write_text("from app import add\n\ndef test_add():\n"
                                                "    assert add(1, 2) == 3\n")
    ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@x", **clean}
    plain_git(seed, "add", ".", env=ident)
    plain_git(seed, "commit", "--quiet", "-m", "base", env=ident)
    if not bare:
        return seed
    path = tmp_path / f"{name}.git"
    plain_git(tmp_path, "clone", "--quiet", "--bare", str(seed), str(path), env=clean)
    return path


def test_the_plants_run_under_plain_git(tmp_path: Path, plants: Plants) -> None:
    """The control: with the user's and the repository's configuration, the
    plants do run (so the tests below can fail)."""
    repo = _seed(tmp_path, "control", bare=False)
    plants.plant_repository(repo / ".git")
    (repo / "app.py").write_text("changed\n")
    subprocess.run(["git", "commit", "-qam", "x"], cwd=repo, capture_output=True)
    assert any(name.startswith("evil-") for name in plants.ran())  # filters, fsmonitor ...
    # Hooks alone (a filter that fails stops git before any hook).
    hooked = _seed(tmp_path, "hooked", bare=False)
    for hook in plants.hooks.iterdir():
        (hooked / ".git" / "hooks" / hook.name).write_bytes(hook.read_bytes())
        (hooked / ".git" / "hooks" / hook.name).chmod(0o755)
    (hooked / ".gitattributes").unlink()
    (hooked / "app.py").write_text("changed\n")
    clean = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@x"}
    plain_git(hooked, "commit", "-qam", "x", env=clean)
    assert any(name.startswith("hook-pre-commit") for name in plants.ran())


def _candidate_steps(repo: Repository, tmp_path: Path, base: str) -> str:
    """The worker's git steps for one attempt: seed its clone, bundle what
    it committed there (as its cell does), import the bundle, make the
    candidate and publish it; returns the candidate."""
    work = tmp_path / "attempt" / "work"
    repo.seed_workspace(work, base, "ledger/1/1", repositories.Identity("agent", "agent@x"))
    (work / "app.py").write_text("def add(a, b):\n    return a + b\n")
    clean = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
             "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@x"}
    # (the attempt's own git, in its own clone: what runs there is its business)
    plain_git(work, "-c", "core.hooksPath=/dev/null", "commit", "-qam", "fix", env=clean)
    bundle = tmp_path / "attempt" / "candidate.bundle"
    plain_git(work, "bundle", "create", "-q", str(bundle), f"{base}..HEAD", env=clean)
    head = repo.import_bundle(bundle, 1 << 20)
    assert repo.is_ancestor(base, head)
    message = repositories.with_trailers(repo.path, "fix add", [("Ledger-Campaign", "1")])
    candidate = repo.make_candidate(head, base, message, repositories.LEDGER, repositories.LEDGER)
    assert repositories.diff(repo.path, base, candidate)
    assert repositories.changed_paths(repo.path, base, candidate) == ["app.py"]
    assert repositories.file_at(repo.path, candidate, "app.py") == b"def add(a, b):\n    return a + b\n"
    repo.publish("refs/heads/ledger/1/1", candidate)
    return candidate


def _judge_and_promote(repo: Repository, tmp_path: Path, base: str, candidate: str) -> None:
    """The verifier's step (an export with protected paths from the base),
    the dispatcher's (the landed commit, a compare-and-swap promotion, a
    replay onto a moved target) and retention's."""
    repo.fetch("refs/heads/ledger/1/1")
    repo.export_tree(candidate, tmp_path / "verify" / "checkout", replace_from=base,
                     paths=["tests/test_app.py"])
    landed = repo.land(candidate, base, trailers=[("Ledger-Campaign", "1")],
                       committer=repositories.LEDGER, committed_at=1_700_000_000)
    repo.update_ref("refs/heads/main", landed, base)
    assert repo.remote_ref("refs/heads/main") == landed
    other = repo.land(candidate, base, trailers=[("Ledger-Campaign", "2")],
                      committer=repositories.LEDGER, committed_at=1_700_000_001)
    repo.replay(base, landed, other)  # (conflicting or not: only what runs matters here)
    assert [b[0] for b in repo.attempt_branches()] == ["refs/heads/ledger/1/1"]
    for ref, sha, _c, _a in repo.attempt_branches():
        assert repo.delete_ref(ref, sha)
    repo.prune_worktrees()


def test_no_plant_runs_in_the_git_steps_of_the_loop(tmp_path: Path, plants: Plants) -> None:
    # A non-bare repository whose main is checked out: promotion moves its
    # work tree (read-tree -u applies filters, runs post-checkout...).
    user = _seed(tmp_path, "user", bare=False)
    plants.plant_repository(user / ".git")
    repo = Repository(str(user))
    base = repo.rev_parse("refs/heads/main")
    assert base is not None
    candidate = _candidate_steps(repo, tmp_path, base)
    _judge_and_promote(repo, tmp_path, base, candidate)
    assert (user / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert plants.ran() == [], f"repository-controlled programs ran: {plants.ran()}"


def test_no_plant_runs_through_a_remote_and_its_caches(tmp_path: Path, plants: Plants) -> None:
    remote = _seed(tmp_path, "remote", bare=True)
    plants.plant_repository(remote)
    worker = Repository(f"file://{remote}", cache_dir=tmp_path / "worker-cache")
    base = worker.resolve("main")
    plants.plant_repository(worker.path)  # and the cache itself, planted afterwards
    candidate = _candidate_steps(worker, tmp_path / "w", base)
    dispatcher = Repository(f"file://{remote}", cache_dir=tmp_path / "dispatcher-cache")
    dispatcher.resolve("main")
    plants.plant_repository(dispatcher.path)
    _judge_and_promote(dispatcher, tmp_path / "d", base, candidate)
    assert plants.ran() == [], f"repository-controlled programs ran: {plants.ran()}"


def test_every_program_key_a_repository_defines_is_blanked(tmp_path: Path, plants: Plants) -> None:
    user = _seed(tmp_path, "keys", bare=False)
    plants.plant_repository(user / ".git")
    blanked = dict((k.lower(), v) for k, v in hardened_git.overrides(user))
    for key in ("filter.evil.clean", "filter.evil.smudge", "filter.evil.process", "diff.evil.textconv",
                "diff.evil.command", "merge.evil.driver", "remote.origin.uploadpack",
                "remote.origin.receivepack", "core.fsmonitor", "gpg.program", "core.sshcommand"):
        assert key in blanked, key
        assert blanked[key] in ("", "false", "ssh", "cat", "git-upload-pack", "git-receive-pack"), (key, blanked[key])
        assert "evil" not in blanked[key]
    assert blanked["filter.evil.required"] == "false"
    assert blanked["core.hookspath"] == "/dev/null"
    # A caller cannot point git elsewhere through the hardened environment.
    with pytest.raises(ValueError):
        hardened_git.environment(user, {"GIT_DIR": "/elsewhere"})


def test_an_executable_is_not_needed_to_be_refused(tmp_path: Path) -> None:
    """The hooks directory git is pointed at does not exist, whatever the
    repository holds: git finds no hook to run, executable or not."""
    env = hardened_git.environment(None)
    keys = {env[k]: env[k.replace("KEY", "VALUE")] for k in env if k.startswith("GIT_CONFIG_KEY_")}
    assert keys["core.hooksPath"] == os.devnull
    assert not stat.S_ISDIR(os.stat(os.devnull).st_mode)
