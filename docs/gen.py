"""The reference pages of the documentation, generated from the code so they
cannot drift from it: the configuration (``ledger.toml``'s pydantic models,
``Settings`` and every environment variable the command line reads), the
command line (the typer app), the exit codes and errors (``ledger.errors``,
the CLI's table) and the attempt protocol (``ledger.protocol``).

``mkdocs build`` adds them through ``docs/hooks.py``; to read them without
building the site: ``python docs/gen.py OUTDIR`` writes them there.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

GENERATED = ("This page is generated from the code (`docs/gen.py`) each time the site is built; "
             "edit the code, not the page.")

def md(text: object) -> str:
    """``text`` safe inside a Markdown table cell."""
    return (" ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;"))


def code(text: object) -> str:
    return "`" + str(text).replace("|", "\\|").replace("`", "'") + "`"


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def doc(obj: object) -> str:
    """The first paragraph of an object's docstring, on one line."""
    text = (inspect.getdoc(obj) or "").replace("``", "`")
    return " ".join(text.split("\n\n")[0].split())


def paragraphs(obj: object, first: int, last: int | None) -> str:
    """Paragraphs ``first`` to ``last`` (exclusive) of a docstring, each on one line."""
    text = (inspect.getdoc(obj) or "").replace("``", "`")
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n")[first:last])


# --- configuration ---------------------------------------------------------------------------


def type_name(annotation: Any, anchors: dict[type, str]) -> str:
    """A field's type in words (TOML's names)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in anchors:
        return f"[table](#{anchors[annotation]})"
    if origin in (typing.Union, types.UnionType):
        shown = [type_name(a, anchors) for a in args if a is not type(None)]
        return " or ".join(shown) + (" (optional)" if type(None) in args else "")
    if origin is typing.Literal:
        return " or ".join(code(json.dumps(a)) for a in args)
    if origin is list:
        return f"array of {type_name(args[0], anchors)}" if args else "array"
    if origin is dict and len(args) > 1 and args[1] is Any:
        return "object"
    if origin is dict:
        keys = typing.get_args(args[0]) if args and typing.get_origin(args[0]) is typing.Literal else ()
        values = type_name(args[1], anchors) if len(args) > 1 else "values"
        return (f"table of {values}" + (f" by {', '.join(code(k) for k in keys)}" if keys else ""))
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def constraints(info: FieldInfo) -> str:
    """A field's range and pattern, from its metadata."""
    found = []
    unit = "item(s)" if typing.get_origin(info.annotation) is list else "character(s)"
    words = {"ge": "≥ {}", "gt": "> {}", "le": "≤ {}", "lt": "< {}",
             "min_length": "at least {} " + unit, "max_length": "at most {} " + unit}
    for meta in info.metadata:
        for attr, shown in words.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(shown.format(value))
        pattern = getattr(meta, "pattern", None)
        if pattern:
            found.append(f"matches {code(pattern)}")
    return ", ".join(found)


def default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its defaults"
        if isinstance(value, Path):
            return "per user (see meaning)"
        return code(json.dumps(value)) if value not in ([], {}) else "empty"
    if info.default is PydanticUndefined:
        return "**required**"
    if info.default is None:
        return "unset"
    if isinstance(info.default, Path):
        return code(info.default)
    return code(json.dumps(info.default))


def model_rows(model: type[BaseModel], anchors: dict[type, str], *, skip: tuple[str, ...] = ()
               ) -> list[tuple[str, ...]]:
    rows = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        meaning = info.description or ""
        rows.append((code(info.alias or name), type_name(info.annotation, anchors),
                     default_text(info), md(constraints(info)), md(meaning)))
    return rows


def settings_rows() -> list[tuple[str, ...]]:
    from ledger.settings import SETTINGS, Settings

    rows = []
    for name, info in Settings.model_fields.items():
        knob = SETTINGS[name]
        option = f" ({code(knob.flags[0])})" if knob.flags else ""
        rows.append((code(knob.envvar) + option, type_name(info.annotation, {}),
                     default_text(info), md(constraints(info)), md(info.description or "")))
    return rows


def knob_default(knob: Any) -> str:
    value = knob.default_factory() if knob.default_factory is not None else knob.default
    if value is None:
        return "unset"
    if value in ([], {}):
        return "empty"
    return code(value if isinstance(value, Path) else json.dumps(value))


def option_rows() -> list[tuple[str, ...]]:
    """Every option's knob: its variable, the commands that take it (and a
    command's own default where it differs), default, range and meaning."""
    from ledger.settings import OPTIONS

    uses = option_variables()
    rows = []
    for name, knob in OPTIONS.items():
        found = uses.get(knob.envvar, [])
        if not found:
            raise SystemExit(f"docs/gen.py: knob {name} is no command's option")
        where = ", ".join(sorted({f"{code(command)} {code(option)}" for command, option, _ in found}))
        default = knob_default(knob)
        own = sorted({f"{code(command)}: {code(json.dumps(value))}" for command, _, value in found
                      if value != knob.default and value is not None and not isinstance(value, list)})
        rows.append((code(knob.envvar), where, default + (f" ({', '.join(own)})" if own else ""),
                     md(knob.range_text()), md(knob.help)))
    return rows


def leaf_commands() -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Every command of the app: its path, the click command and its context."""
    import typer.main

    from ledger.cli import app

    root = typer.main.get_command(app)
    context_class = type(root).context_class

    def walk(group: Any, path: tuple[str, ...], parent: Any) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
        for name, command in group.commands.items():
            ctx = context_class(command, info_name=name, parent=parent)
            if hasattr(command, "commands"):
                yield from walk(command, (*path, name), ctx)
            else:
                yield (*path, name), command, ctx
    yield from walk(root, (), context_class(root, info_name="ledger"))


def option_variables() -> dict[str, list[tuple[str, str, Any]]]:
    """Environment variable -> (command, option, default) of every option that reads one."""
    import typer.main

    from ledger.cli import app

    found: dict[str, list[tuple[str, str, Any]]] = {}
    for param in typer.main.get_command(app).params:
        if param.envvar:
            found.setdefault(param.envvar, []).append(("ledger", param.opts[0], param.default))
    for path, command, _ctx in leaf_commands():
        for param in command.params:
            if getattr(param, "envvar", None):
                found.setdefault(param.envvar, []).append(
                    ("ledger " + " ".join(path), param.opts[0], param.default))
    return found


def direct_variables() -> dict[str, str]:
    """The ``LEDGER_*`` variables read where they are used: the environment
    knobs (a variable the code reads itself fails the build: declare it)."""
    from ledger.settings import ENVIRONMENT

    pattern = re.compile(r"""(?:environ(?:\.get)?[(\[]|getenv\()\s*["'](LEDGER_[A-Z0-9_]+)["']""")
    names = set()
    import ledger

    for path in Path(ledger.__file__).parent.rglob("*.py"):
        names.update(pattern.findall(path.read_text()))
    if names:
        raise SystemExit(f"docs/gen.py: declare {', '.join(sorted(names))} as knobs (ledger.settings)")
    return dict(sorted((knob.envvar, knob.help) for knob in ENVIRONMENT.values()))


def configuration_page() -> str:
    from ledger import config
    from ledger.sandbox.cell import CellPolicy

    models = {config.CampaignClassConfig: "classes", config.Backoff: "backoff",
              config.Acceptance: "acceptance", config.RoleAuthority: "authority",
              config.SensorConfig: "sensors", CellPolicy: "cell",
              config.PytestJudge: "acceptance-pytest", config.ScreenSettings: "acceptance-screen",
              config.ScreenRule: "acceptance-screen-extra", config.HeldOut: "acceptance-held-out",
              config.Review: "acceptance-review", config.ResourceLimits: "limits",
              config.KeyLimits: "keys"}
    nested = [(CellPolicy, "`cell` (of a class, its `acceptance` or a sensor)", "cell"),
              (config.PytestJudge, "`acceptance.pytest`", "acceptance-pytest"),
              (config.ScreenSettings, "`acceptance.screen`", "acceptance-screen"),
              (config.ScreenRule, "`acceptance.screen.extra[]`", "acceptance-screen-extra"),
              (config.HeldOut, "`acceptance.held_out`", "acceptance-held-out"),
              (config.Review, "`acceptance.review`", "acceptance-review")]
    headers = ("key", "type", "default", "range", "meaning")
    nested_parts = []
    for model, title, anchor in nested:
        nested_parts += [f"### {title} {{#{anchor}}}", doc(model),
                         table(headers, model_rows(model, models))]
    headers = ("key", "type", "default", "range", "meaning")
    settings = settings_rows()
    from ledger.settings import Settings

    direct = [(code(name), md(meaning)) for name, meaning in direct_variables().items()]
    return "\n\n".join([
        "# Configuration reference",
        GENERATED,
        "Ledger is configured in two places: **`ledger.toml`** says what the campaigns are (their "
        "classes and the sensors that open them) and is read by the worker, verifier, sensors and "
        "`ledger classes sync`; the **environment** (`LEDGER_*`, or the matching options) says "
        "where the database is and how each process runs. Every variable is a knob declared "
        "once in `ledger.settings` (its name, default, range and help); the variable is "
        "`LEDGER_` and the knob's name in capitals.",
        "## `ledger.toml`",
        paragraphs(config, 1, 2),
        "The file has tables of tables: `[classes.NAME]` and `[sensors.NAME]`, and for limits `[limits.RESOURCE]` and `[keys.\"KIND:VALUE\"]` ([limits](../limits.md)); a class or sensor name matches "
        f"{code(config.NAME)}. Unknown keys are refused (exit 78, naming the key).",
        "```toml\n" + (inspect.getdoc(config) or "").split("Example::")[1].split("\n\n")[1]
        .replace("\n    ", "\n").strip() + "\n```",
        paragraphs(config, -1, None).replace("Example::", "").strip(),
        "### `[classes.NAME]` {#classes}",
        doc(config.CampaignClassConfig) + " The part the kernel judges (attempts, lease, backoff, "
        "authority, acceptance, promotion, weight) is registered in the database by "
        "`ledger classes sync`.",
        table(headers, model_rows(config.CampaignClassConfig, models, skip=("name",))),
        "### `backoff` {#backoff}",
        doc(config.Backoff),
        table(headers, model_rows(config.Backoff, models)),
        "### `acceptance` {#acceptance}",
        doc(config.Acceptance),
        table(headers, model_rows(config.Acceptance, models)),
        "### `authority.worker`, `authority.dispatcher` {#authority}",
        doc(config.RoleAuthority),
        table(headers, model_rows(config.RoleAuthority, models)),
        "### `[sensors.NAME]` {#sensors}",
        doc(config.SensorConfig) + " Exactly one schedule (`every_s` or `cron`) and one check "
        "(`command` or `url`).",
        table(headers, model_rows(config.SensorConfig, models, skip=("name",))),
        "### `[limits.RESOURCE]` {#limits}",
        doc(config.ResourceLimits) + " A resource is named like a class; see [limits](../limits.md).",
        table(headers, model_rows(config.ResourceLimits, models)),
        "### `[keys.\"KIND:VALUE\"]` {#keys}",
        doc(config.KeyLimits) + " A key matches " + code(config.LIMIT_KEY) + ".",
        table(headers, model_rows(config.KeyLimits, models)),
        *nested_parts,
        "## Environment",
        "### Settings",
        doc(Settings) + " Each also has its option where one is shown; an invalid value stops "
        "every command with one line naming the variable (exit 78).",
        table(("variable", "type", "default", "range", "meaning"), settings),
        "### Options read from the environment",
        "Every option of the command line that has a variable is a knob below (the settings "
        "above are the rest); see the [command-line reference](cli.md). A value out of its "
        "range stops the command with one line naming the option and its variable (exit 2).",
        table(("variable", "option", "default", "range", "meaning"), option_rows()),
        "### Read where they are used",
        "Variables without an option, read each time they are needed.",
        table(("variable", "meaning"), direct),
    ]) + "\n"


# --- command line ---------------------------------------------------------------------------


def _help_record(param: Any, ctx: Any) -> tuple[str, str, str, str]:
    """(option, variable, default, meaning) of one parameter, as ``--help`` shows it."""
    term, text = param.get_help_record(ctx) or ("", "")
    extra: list[str] = []
    default = "-"
    if text.endswith("]") and "  [" in text:
        text, _, bracket = text.rpartition("  [")
        for item in bracket[:-1].split("; "):
            if item.startswith("env var: "):
                continue
            if item.startswith("default: "):
                default = code(item.removeprefix("default: "))
            else:
                extra.append(item)
    meaning = md(text) + (" " + md(f"[{'; '.join(extra)}]") if extra else "")
    return code(term), code(param.envvar) if getattr(param, "envvar", None) else "-", default, meaning


def _command_help(command: Any) -> str:
    text = inspect.cleandoc(command.help or "")
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b").strip()


def cli_page() -> str:
    import typer.main

    from ledger.cli import app

    root = typer.main.get_command(app)
    root_ctx = type(root).context_class(root, info_name="ledger")
    parts = ["# Command-line reference", GENERATED,
             "Every command prints data on stdout (`--json` for machines) and messages on stderr; "
             "a failure is one line on stderr and an [exit code](errors.md). Every option can "
             "also be given as the environment variable shown.",
             "## Global options",
             "They come before the command: `ledger --database-url URL list`.",
             table(("option", "variable", "default", "meaning"),
                   [_help_record(p, root_ctx) for p in root.params])]
    groups: dict[str, str] = {name: c.help or "" for name, c in root.commands.items()
                              if hasattr(c, "commands")}
    for path, command, ctx in sorted(leaf_commands(), key=lambda item: item[0]):
        name = "ledger " + " ".join(path)
        parts.append(f"## `{name}`")
        if len(path) > 1 and path[0] in groups:
            parts.append(f"Part of `ledger {path[0]}`: {md(groups[path[0]])}")
        parts.append("```\n" + command.get_usage(ctx) + "\n```")
        parts.append(_command_help(command))
        rows = [_help_record(p, ctx) for p in command.params if p.get_help_record(ctx)]
        if rows:
            parts.append(table(("argument or option", "variable", "default", "meaning"), rows))
    return "\n\n".join(parts) + "\n"


# --- errors ---------------------------------------------------------------------------------


def error_classes() -> list[type[Any]]:
    import ledger.api.problems  # noqa: F401 -- defines the HTTP-only errors
    import ledger.git.repository  # noqa: F401 -- GitError
    import ledger.roles.verifier  # noqa: F401 -- CheckFailed
    from ledger.errors import LedgerError

    found: list[type[Any]] = []
    pending: list[type[Any]] = [LedgerError]
    while pending:
        cls = pending.pop(0)
        found.append(cls)
        pending.extend(sorted(cls.__subclasses__(), key=lambda c: c.__name__))
    return found


def errors_page() -> str:
    from ledger import errors
    from ledger.cli.failures import EXIT_CODES

    classes = [(code(c.__name__), code(c.slug), str(c.http_status), str(c.exit_code), md(doc(c)))
               for c in error_classes()]
    by_class: dict[str, list[str]] = {}
    for state, cls in errors.SQLSTATES.items():
        by_class.setdefault(cls.__name__, []).append(state)
    sqlstates = [(", ".join(code(s) for s in states), code(name)) for name, states in by_class.items()]
    return "\n\n".join([
        "# Exit codes and errors", GENERATED,
        "Every failure of a command is one line on stderr, `ledger: what went wrong (hint: what "
        "to do)`, and one of these exit codes; never a traceback (`LEDGER_DEBUG=1` adds it, "
        "for a bug report). `ledger --help` prints the same table.",
        "## Exit codes",
        table(("code", "meaning"), [(str(c), md(m)) for c, m in EXIT_CODES]),
        "## Error classes",
        "Each error Ledger raises on purpose is one class with a stable problem type "
        "(`/problems/<slug>` in the HTTP API's `application/problem+json` answers), an HTTP "
        "status and the command line's exit code, so every surface reports it the same way.",
        table(("class", "slug", "HTTP", "exit", "meaning"), classes),
        "## SQLSTATEs",
        "The database raises Ledger's own SQLSTATEs (`LG001` ...); PostgreSQL's own codes that "
        "mean the same to a caller map onto the same classes. The class is decided by the code, "
        "never by the message text.",
        table(("SQLSTATE", "class"), sqlstates),
        "Retried with backoff by the session (the statement certainly did not take effect): "
        + ", ".join(code(s) for s in sorted(errors.TRANSIENT_SQLSTATES)) + ". A connection "
        "lost during a call (" + ", ".join(code(s) for s in sorted(errors.CONNECTION_LOST_SQLSTATES))
        + ") is `OutcomeUnknown`: only an idempotent call is retried; one refused before "
        "anything ran (" + ", ".join(code(s) for s in sorted(errors.CONNECTION_REFUSED_SQLSTATES))
        + ") is `Unavailable`.",
    ]) + "\n"


# --- attempt protocol -----------------------------------------------------------------------


def protocol_page() -> str:
    from ledger import protocol
    from ledger.roles import attempt
    from ledger.sandbox import processes

    models = {protocol.PreviousAttempt: "previous-attempts"}
    headers = ("field", "type", "meaning")

    def rows(model: type[BaseModel]) -> list[tuple[str, ...]]:
        return [(code(info.alias or name), type_name(info.annotation, models), md(info.description))
                for name, info in model.model_fields.items()]
    schema = json.dumps(protocol.AttemptContext.model_json_schema(by_alias=True), indent=2)
    allowed = ", ".join(code(v) for v in processes.ALLOWED) + ", `LC_*`"
    return "\n\n".join([
        "# Attempt protocol", GENERATED,
        doc(protocol) + " This page is the contract between Ledger and your agent or script.",
        "## The campaign file",
        doc(protocol.AttemptContext) + " Its path is in `LEDGER_CAMPAIGN_FILE` and the "
        "`{campaign_file}` placeholder.",
        table(headers, rows(protocol.AttemptContext)),
        "### `previous_attempts[]` {#previous-attempts}",
        doc(protocol.PreviousAttempt),
        table(headers, rows(protocol.PreviousAttempt)),
        "### JSON Schema",
        "```json\n" + schema + "\n```",
        "## The command line",
        "`attempt_command` is an argv list (no shell). Each argument may contain these "
        "placeholders (Python `str.format` syntax, e.g. `\"--objective-file={campaign_file}\"`); "
        "the command runs in the worktree, in a process group of its own.",
        table(("placeholder", "replaced by"),
              [(code("{" + k + "}"), md(v)) for k, v in protocol.PLACEHOLDERS.items()]),
        "## The environment",
        f"An allow-list of the worker's environment ({allowed}), a private temporary directory "
        f"({', '.join(code(v) for v in processes.TEMP_VARIABLES)}), the class's "
        "`attempt_environment` (`NAME` passes the worker's value on, `NAME=VALUE` sets one; "
        "`LEDGER_*`, `PG*` and `DATABASE_URL` are never passed), and:",
        table(("variable", "value"), [(code(k), md(v)) for k, v in protocol.ENVIRONMENT.items()]),
        "## The commit message",
        f"The command may write the candidate's commit message to `commit_message_file` "
        f"(`$LEDGER_COMMIT_MESSAGE_FILE`, named {code(attempt.MESSAGE_FILE)}, outside the "
        f"worktree); its first {attempt._MESSAGE_LIMIT // 1024} KiB are used. Without one the "
        "message is `ledger: campaign N attempt M` and the objective key. Either way the worker "
        "adds the trailers `Ledger-Campaign: N` and `Ledger-Attempt: M`, and commits every change "
        "the command left in the worktree, as the class's `author`.",
        "## Output and exit status",
        f"Standard output and error are streamed into the campaign's journal as they come "
        f"(the dashboard and `ledger tail` show them live); the last "
        f"{attempt._LOG_TAIL // 1024} KiB are kept with the attempt. What the ending means:",
        table(("when the command ...", "then"),
              [(md(when), md(then)) for when, then in protocol.EXIT_STATUS]),
        "A lease that is lost meanwhile (the campaign abandoned, the worker partitioned away) "
        "kills the command's process group; nothing more is written for the attempt.",
        "## Reporting usage {#usage}",
        doc(protocol.UsageReport) + f" A line is `{protocol.USAGE_PREFIX.strip()} {{...}}` on a line "
        f"of its own, at most {protocol.USAGE_LINE_BYTES} bytes; at most {protocol.USAGE_REPORTS:,} "
        "are taken from one attempt. Budgets and rate limits: [limits](../limits.md).",
        table(headers, rows(protocol.UsageReport)),
        "```\nLEDGER_USAGE {\"tokens_in\": 1200, \"tokens_out\": 300, \"requests\": 1, \"cost\": 0.004}\n```",
    ]) + "\n"


def metric_families() -> list[tuple[str, str, list[str], str]]:
    """Every family ``GET /metrics`` serves: (name as scraped, type, labels,
    help), read from the collector itself over a snapshot with one row of
    everything, so that every family shows its labels."""
    from types import SimpleNamespace

    from ledger.api import metrics

    one = [(1.0, 0, 0.0), (float("inf"), 0, 0.0)]
    snapshot = metrics.Snapshot(
        states={"ready": 0}, class_states={("c", "ready"): 0}, oldest_ready_age_s=None,
        transitions={"claim": 0}, attempts={"failed": 0}, verifications={},
        side_effects={("git.update_ref", "pending"): 0}, attempt_durations=one,
        verification_durations=one, waiting={("c", "target"): 0},
        sensor_outcomes={("s", "error"): 0}, sensor_errors={"s": 0}, approvals={"c": (0, 0.0)},
        approval_decisions={("approved", "operator"): 0},
        not_ready={"worker": 0})
    hub = SimpleNamespace(reconnects=0, connected=True, deaf=False, misses=0, dropped=0)
    process = metrics.ProcessCounters()
    process.count_request("GET", "/status", 200, 0.01)
    collector = metrics.LedgerCollector(snapshot, hub, process)  # type: ignore[arg-type]
    found = []
    for family in collector.collect():
        labels = sorted({k for s in family.samples for k in s.labels if k not in ("le",)})
        name = family.name + ("_total" if family.type == "counter" else "")
        found.append((name, family.type, labels, family.documentation))
    return found


def metrics_page() -> str:
    from ledger.api import metrics

    rows = [(code(name + ("{" + ",".join(labels) + "}" if labels else "")), kind, md(help_))
            for name, kind, labels, help_ in metric_families()]
    return "\n\n".join([
        "# Metrics reference",
        GENERATED,
        "`GET /metrics` (any token) serves Prometheus text. The campaign, attempt, verdict and "
        "outbox figures are read from the database at scrape time, so every `ledger serve` "
        "reports the same database-wide numbers (take the max over instances); the hub's and "
        "the HTTP figures are the answering process's own. No series has a campaign label, so "
        "the number of series does not grow with the campaigns; HTTP methods outside the "
        "standard ones count as `other` and unmatched paths as `unmatched`.",
        table(("series", "type", "meaning"), rows),
        "Duration buckets (seconds): attempts and verifications "
        + ", ".join(f"{b:g}" for b in metrics.DURATION_BUCKETS) + "; HTTP requests "
        + ", ".join(f"{b:g}" for b in metrics.REQUEST_BUCKETS) + " (event streams are not "
        "timed). `ledger_campaigns_waiting` has one series per class and reason ("
        + ", ".join(code(r) for r in metrics.WAITING_REASONS) + "); "
        "`ledger_sensor_observations_total` one per sensor and outcome ("
        + ", ".join(code(o) for o in metrics.OUTCOMES) + "; see [sensors](../sensors.md)).",
        "## Health",
        "`GET /livez` answers when the process does. `GET /readyz` answers `200` when the "
        "database answers and is migrated to this code's head (else `503`), with "
        "`\"status\": \"degraded\"` and the reasons (counts only) while the hub is deaf, the "
        "notification queue is over half full, or campaigns wait on a system fault. The "
        "[alarms](../alarms.md) are built on these series.",
    ]) + "\n"


#: Generated page -> its generator.
PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_page,
    "reference/cli.md": cli_page,
    "reference/errors.md": errors_page,
    "reference/attempt-protocol.md": protocol_page,
    "reference/metrics.md": metrics_page,
}


def pages() -> dict[str, str]:
    """Every generated page, by its path under ``docs/``."""
    return {path: make() for path, make in PAGES.items()}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/gen.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for path, text in pages().items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
        print(out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
