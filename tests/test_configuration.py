"""One configuration model (``ledger.settings``) and one signal path (the host).

Every knob is declared once: the tests here check that nothing else reads the
environment, that every option of the command line with a variable is a
knob's (the variable derived from its name, the knob's default and help), that
each knob's range stops a command with one line and its documented exit code,
and that only the host handles signals.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from ledger.cli import app, main
from ledger.cli.failures import EXIT_CODES
from ledger.errors import ConfigError, InvalidInput
from ledger.settings import ENV_PREFIX, KNOBS, OPTIONS, SETTINGS, Knob, OptionKnobs, SettingKnobs

SRC = Path(__file__).parents[1] / "src" / "ledger"
#: The one module that reads the environment.
SETTINGS_MODULE = SRC / "settings.py"
#: The one module that handles signals.
HOST_MODULE = SRC / "runtime" / "host.py"
#: ``cell_init`` is the init process inside an attempt's cell, a program of its
#: own: it gives the command it runs SIGPIPE's default back (Python ignores it),
#: which is that command's inheritance, not how a Ledger process stops.
NOT_LEDGER_PROCESSES = {SRC / "sandbox" / "cell_init.py"}


def sources() -> Iterator[tuple[Path, ast.AST]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_only_the_settings_module_reads_the_environment() -> None:
    """No ``os.environ``, ``os.getenv`` (or ``from os import environ``) in
    ``src/`` outside ``ledger.settings``: a knob is read through ``Settings``,
    its option or ``settings.environment``, and a child's environment starts
    from ``settings.inherited_environment``."""
    found = []
    for path, tree in sources():
        if path == SETTINGS_MODULE:
            continue
        for node in ast.walk(tree):
            name = dotted(node) if isinstance(node, ast.Attribute) else ""
            if name in ("os.environ", "os.environb", "os.getenv", "os.getenvb", "os.putenv"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")  # type: ignore[attr-defined]
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                for alias in node.names:
                    if alias.name in ("environ", "environb", "getenv", "putenv"):
                        found.append(f"{path.relative_to(SRC)}:{node.lineno} from os import {alias.name}")
    assert not found, found


def test_only_the_host_handles_signals() -> None:
    """``signal.signal`` and ``add_signal_handler`` appear only in the host
    (``ledger.runtime.host``), which also makes an early SIGTERM a clean stop
    for a command declared a service."""
    found = []
    for path, tree in sources():
        if path == HOST_MODULE or path in NOT_LEDGER_PROCESSES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = dotted(node.func)
                if name == "signal.signal" or name.endswith(".add_signal_handler") \
                        or name == "signal.set_wakeup_fd":
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
            if isinstance(node, ast.ImportFrom) and node.module == "signal" \
                    and any(a.name == "signal" for a in node.names):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} from signal import signal")
    assert not found, found


def options() -> Iterator[tuple[str, Any]]:
    """(command, click parameter) of every option of the command line."""
    root = typer.main.get_command(app)
    for param in root.params:
        yield "ledger", param

    def walk(group: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
        for name, command in sorted(group.commands.items()):
            if hasattr(command, "commands"):
                yield from walk(command, (*path, name))
            else:
                for param in command.params:
                    yield " ".join((*path, name)), param
    yield from walk(root, ())


#: Commands whose option has a default of their own (the help says it).
OWN_DEFAULTS = {("mcp", "log_level"): "warning"}


def knob_of(param: Any) -> Knob:
    name = param.envvar.removeprefix(ENV_PREFIX).lower()
    assert param.envvar.startswith(ENV_PREFIX) and name in KNOBS, param.envvar
    return KNOBS[name]


def test_every_option_with_a_variable_is_a_knob_with_the_derived_variable() -> None:
    """Each option that reads a variable is made from its knob: the variable
    is ``LEDGER_`` and the knob's name in capitals, the option is one of the
    knob's flags, and its default and help are the knob's. Every option knob
    is some command's option."""
    used = set()
    for command, param in options():
        if not getattr(param, "envvar", None):
            continue
        knob = knob_of(param)
        used.add(knob.name)
        assert param.envvar == ENV_PREFIX + knob.name.upper() == knob.envvar
        assert set(param.opts) | set(param.secondary_opts) <= set(
            flag for decl in knob.flags for flag in decl.split("/")), (command, param.opts)
        assert param.help.startswith(knob.help), (command, knob.name)
        if knob.range_text():
            assert f"Range: {knob.range_text()}." in param.help, (command, knob.name)
        if knob.name in SETTINGS:
            assert param.default is None  # Settings reads the variable and applies the default
        else:
            expected = OWN_DEFAULTS.get((command, knob.name),
                                        knob.default_factory() if knob.default_factory
                                        else knob.default)
            assert param.default == expected, (command, knob.name)
    assert set(OPTIONS) <= used, set(OPTIONS) - used
    assert all(name.islower() and name.isidentifier() for name in KNOBS)


def outside(knob: Knob, integer: bool) -> list[float]:
    """Values just outside ``knob``'s range, on each side it has."""
    step = 1 if integer else 0.5
    values: list[float] = []
    for low, inclusive in ((knob.ge, True), (knob.gt, False)):
        if low is not None:
            values.append(low - step if inclusive else low)
    for high, inclusive in ((knob.le, True), (knob.lt, False)):
        if high is not None:
            values.append(high + step if inclusive else high)
    return [int(v) if integer else v for v in values]


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
             env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """``ledger ARGV`` through the console entry point, in this process."""
    monkeypatch.setattr(sys, "argv", ["ledger", *argv])
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return int(exited.value.code or 0), lines


RANGED_OPTIONS = sorted({(command, param.opts[0], knob_of(param).name,
                          "int" in OptionKnobs.__annotations__[knob_of(param).name])
                         for command, param in options()
                         if getattr(param, "envvar", None) and knob_of(param).range_text()
                         and knob_of(param).name not in SETTINGS})


@pytest.mark.parametrize(("command", "flag", "name", "integer"), RANGED_OPTIONS,
                         ids=[f"{c}:{f}" for c, f, _n, _i in RANGED_OPTIONS])
def test_an_option_out_of_its_range_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        command: str, flag: str, name: str, integer: bool) -> None:
    """Each ranged option refuses a value just outside its range, on either
    side, before anything is done: one line naming the option and its
    variable, and exit 2 (InvalidInput: "bad usage or invalid input")."""
    knob = KNOBS[name]
    monkeypatch.setenv("LEDGER_DATA_DIR", str(tmp_path))  # nothing may be started there
    for value in outside(knob, integer):
        code, lines = run_main(monkeypatch, capsys, [*command.split(), flag, str(value)])
        assert code == InvalidInput.exit_code == 2, (value, lines)
        assert lines == [f"ledger: {flag} / {knob.envvar}: must be "
                         f"{knob.range_text().replace(', ', ' and ')}, not {value}"]
    assert not any(tmp_path.iterdir())
    assert any(c == 2 for c, _ in EXIT_CODES)


RANGED_SETTINGS = [knob for knob in SETTINGS.values() if knob.range_text() or knob.pattern]


@pytest.mark.parametrize("knob", RANGED_SETTINGS, ids=[k.name for k in RANGED_SETTINGS])
def test_a_setting_out_of_its_range_is_one_line_and_exit_78(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], knob: Knob) -> None:
    """A setting's range (or pattern) is pydantic's, from the same knob: an
    invalid value stops any command with one line naming the variable (and
    its option), exit 78 ("invalid configuration")."""
    integer = "int" in SettingKnobs.__annotations__[knob.name]
    bad = [str(v) for v in outside(knob, integer)] or ["Not-A-Prefix"]
    for value in bad:
        code, lines = run_main(monkeypatch, capsys, ["list"], {knob.envvar: value})
        assert code == ConfigError.exit_code == 78, (value, lines)
        assert len(lines) == 1 and lines[0].startswith(f"ledger: {knob.envvar}"), lines
        assert "input_value" not in lines[0]  # never the value (a setting may be a secret)


@pytest.mark.parametrize("value", ["10.0.0.1/8", "proxy.example", "*, 10.0.0.1", "127.0.0.1;::1"])
def test_an_untrusted_proxy_list_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str) -> None:
    """``LEDGER_FORWARDED_ALLOW_IPS`` is read as uvicorn reads it, but a
    value uvicorn would take as a host name (trusting, silently, nobody) or a
    network with host bits is refused: one line, exit 78."""
    code, lines = run_main(monkeypatch, capsys, ["list"], {"LEDGER_FORWARDED_ALLOW_IPS": value})
    assert code == ConfigError.exit_code == 78, (value, lines)
    assert len(lines) == 1 and lines[0].startswith("ledger: LEDGER_FORWARDED_ALLOW_IPS"), lines


def test_a_trusted_proxy_list_is_what_uvicorn_trusts() -> None:
    from uvicorn.middleware.proxy_headers import _TrustedHosts

    from ledger.settings import forwarded_hosts

    hosts = forwarded_hosts(" 10.0.0.0/8, 192.0.2.7 ,::1,")
    assert hosts == ("10.0.0.0/8", "192.0.2.7", "::1")
    trusted = _TrustedHosts(list(hosts))
    assert {h: h in trusted for h in ("10.1.2.3", "192.0.2.7", "::1", "192.0.2.8", "11.0.0.1")} \
        == {"10.1.2.3": True, "192.0.2.7": True, "::1": True, "192.0.2.8": False, "11.0.0.1": False}
    assert forwarded_hosts(None) == () and forwarded_hosts("*") == ("*",)


def test_a_variable_out_of_range_in_a_real_process(tmp_path: Path) -> None:
    """The same through the environment, in a real process: the variable
    alone is refused like the option (one line, exit 2), before any database
    is looked for."""
    env = {**os.environ, "LEDGER_POLL_S": "0", "LEDGER_DATA_DIR": str(tmp_path / "data"),
           "LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x?connect_timeout=1"}
    proc = subprocess.run([sys.executable, "-m", "ledger", "dispatcher"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ledger: --poll / LEDGER_POLL_S: must be ≥ 0.01 and ≤ 3600, not 0"]
    assert not (tmp_path / "data").exists()
