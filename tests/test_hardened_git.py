"""Ledger's own git never runs code a repository, a user or the system
configured (``ledger.hardened_git``).

Each test plants programs everywhere git looks for them -- every hook, a hooks
path in the repository, in ``$HOME/.gitconfig`` and in a system config, a
fsmonitor, clean/smudge/process filters, diff textconv and external diff,
merge drivers (selected by a committed ``.gitattributes``), a pager, an
editor, credential helpers, ``remote.*.uploadpack``, signing programs, an
``include.path`` pulling in more of them -- each program writing a marker
when it runs. Then it drives the git steps Ledger takes (commits of
candidates, checkouts for verification, promotion into a checked-out branch,
rebases, retention) through ``ledger.repository`` and checks that no marker
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

from ledger import hardened_git
from ledger import repository as repositories
from ledger.repository import Repository

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


def test_no_plant_runs_in_the_git_steps_of_the_loop(tmp_path: Path, plants: Plants) -> None:
    # A non-bare repository whose main is checked out: promotion moves its
    # work tree (read-tree -u applies filters, runs post-checkout...).
    user = _seed(tmp_path, "user", bare=False)
    plants.plant_repository(user / ".git")
    repo = Repository(str(user))
    base = repo.rev_parse("refs/heads/main")
    assert base is not None

    # A candidate made by the worker's steps: a worktree, a commit, a diff.
    work = tmp_path / "attempt"
    repo.add_worktree(work, "main", "ledger/1/1")
    (work / "app.py").write_text("def add(a, b):\n    return a + b\n")
    message = repositories.with_trailers(work, "fix add", [("Ledger-Campaign", "1")])
    assert repositories.commit_all(work, message)
    candidate = repositories.head(work)
    assert repositories.diff(work, base, candidate)
    assert repositories.changed_paths(user, base, candidate) == ["app.py"]
    assert repositories.file_at(user, candidate, "app.py") == b"def add(a, b):\n    return a + b\n"
    repo.remove_worktree(work)

    # The verifier's steps: a clean checkout, protected paths restored.
    checkout = tmp_path / "verify" / "checkout"
    checkout.parent.mkdir()
    repo.clean_checkout(candidate, checkout)
    repositories.restore(checkout, base, ["tests/test_app.py"])

    # The dispatcher's: the landed commit, a compare-and-swap promotion into
    # the checked-out branch (its files move), the rebase path.
    landed = repo.land(candidate, base, trailers=[("Ledger-Campaign", "1")],
                       committer=repositories.LEDGER, committed_at=1_700_000_000)
    repo.update_ref("refs/heads/main", landed, base)
    assert (user / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    from ledger.rebase import rebase
    other = repo.land(candidate, landed, trailers=[("Ledger-Campaign", "2")],
                      committer=repositories.LEDGER, committed_at=1_700_000_001)
    assert rebase(user, base, landed, other, "ledger/2/1") is not None

    # Retention.
    assert [b[0] for b in repo.attempt_branches()]
    for ref, sha, _c, _a in repo.attempt_branches():
        repo.delete_ref(ref, sha)
    repo.prune_worktrees()

    assert plants.ran() == [], f"repository-controlled programs ran: {plants.ran()}"


def test_a_cached_clone_of_a_url_runs_nothing_of_the_remote(tmp_path: Path, plants: Plants) -> None:
    remote = _seed(tmp_path, "remote", bare=True)
    plants.plant_repository(remote)
    repo = Repository(f"file://{remote}", cache_dir=tmp_path / "cache")
    assert repo.rev_parse("refs/heads/main")
    plants.plant_repository(repo.path)  # and the cache itself, planted afterwards
    assert repo.rev_parse("refs/heads/main")  # fetched again
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
