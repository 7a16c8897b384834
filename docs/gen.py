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

#: Variables read straight from the environment (not settings, not options),
#: by name: what they do. A new one in the code fails the build until it is
#: described here.
DIRECT_VARIABLES = {
    "LEDGER_DEBUG": "Set (to anything): a failing command prints its traceback as well as its "
                    "one line, for a bug report.",
    "LEDGER_TABLES": "`tsv` or `rich`: force plain tab-separated tables or drawn ones (default: "
                     "drawn on a terminal, TSV anywhere else).",
    "LEDGER_FAULT_POINTS": "Fault injection for drills and tests (`ledger.faults`): which armed "
                           "fault points fire. Never set in production.",
    "LEDGER_FAULT_DIR": "Fault injection for drills and tests: where armed fault points keep "
                        "their state.",
    "LEDGER_GIT_CONFIG": "A git configuration file of the operator's that Ledger's own git reads "
                         "instead of the user's (credentials, transport settings); its "
                         "program-valued keys are still overridden (`ledger.hardened_git`).",
    "LEDGER_GIT_CREDENTIAL_HELPER": "The credential helper Ledger's own git uses for remotes "
                                    "(as git writes one: `store --file=...`); never given to "
                                    "attempt commands.",
    "LEDGER_MCP_TOKEN": "`ledger mcp` over stdio: the bearer token whose role the agent's "
                        "session acts as.",
    "LEDGER_PATRONI_PG_BIN": "The Patroni drill and test: where the PostgreSQL binaries its "
                             "members run are (default: Debian's PostgreSQL 15).",
}


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
    from ledger.settings import OPTIONS, Settings

    rows = []
    for name, info in Settings.model_fields.items():
        option = f" ({code(OPTIONS[name])})" if name in OPTIONS else ""
        rows.append((code(f"LEDGER_{name.upper()}") + option, type_name(info.annotation, {}),
                     default_text(info), md(constraints(info)), md(info.description or "")))
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


def option_variables() -> dict[str, list[tuple[str, str, str]]]:
    """Environment variable -> (command, option, meaning) of every option that reads one."""
    import typer.main

    from ledger.cli import app

    found: dict[str, list[tuple[str, str, str]]] = {}
    for param in typer.main.get_command(app).params:
        if param.envvar:
            found.setdefault(param.envvar, []).append(("ledger", param.opts[0], param.help or ""))
    for path, command, _ctx in leaf_commands():
        for param in command.params:
            if getattr(param, "envvar", None):
                found.setdefault(param.envvar, []).append(
                    ("ledger " + " ".join(path), param.opts[0], param.help or ""))
    return found


def direct_variables() -> dict[str, str]:
    """The ``LEDGER_*`` variables the code reads itself (``os.environ``)."""
    pattern = re.compile(r"""(?:environ(?:\.get)?[(\[]|getenv\()\s*["'](LEDGER_[A-Z0-9_]+)["']""")
    names = set()
    import ledger

    for path in Path(ledger.__file__).parent.rglob("*.py"):
        names.update(pattern.findall(path.read_text()))
    missing = sorted(names - set(DIRECT_VARIABLES))
    if missing:
        raise SystemExit(f"docs/gen.py: describe {', '.join(missing)} in DIRECT_VARIABLES")
    return {name: DIRECT_VARIABLES[name] for name in sorted(names)}


def configuration_page() -> str:
    from ledger import config

    models = {config.CampaignClassConfig: "classes", config.Backoff: "backoff",
              config.Acceptance: "acceptance", config.RoleAuthority: "authority",
              config.SensorConfig: "sensors"}
    headers = ("key", "type", "default", "range", "meaning")
    settings = settings_rows()
    from ledger.settings import Settings

    variables = option_variables()
    taken = {f"LEDGER_{name.upper()}" for name in Settings.model_fields}
    option_rows = []
    for variable in sorted(variables):
        if variable in taken:
            continue
        uses = variables[variable]
        where = ", ".join(sorted({f"{code(command)} {code(option)}" for command, option, _ in uses}))
        option_rows.append((code(variable), where, md(uses[0][2])))
    direct = [(code(name), md(meaning)) for name, meaning in direct_variables().items()]
    return "\n\n".join([
        "# Configuration reference",
        GENERATED,
        "Ledger is configured in two places: **`ledger.toml`** says what the campaigns are (their "
        "classes and the sensors that open them) and is read by the worker, verifier, sensors and "
        "`ledger classes sync`; the **environment** (`LEDGER_*`, or the matching options) says "
        "where the database is and how each process runs.",
        "## `ledger.toml`",
        paragraphs(config, 1, 2),
        "The file has two tables of tables, `[classes.NAME]` and `[sensors.NAME]`; a name matches "
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
        "## Environment",
        "### Settings",
        doc(Settings) + " Each also has its option where one is shown; an invalid value stops "
        "every command with one line naming the variable (exit 78).",
        table(("variable", "type", "default", "range", "meaning"), settings),
        "### Options read from the environment",
        "Every option of the command line can be given as an environment variable; these are "
        "the ones that are not settings above (see the [command-line reference](cli.md)).",
        table(("variable", "option", "meaning"), option_rows),
        "### Read directly",
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
    import ledger.repository  # noqa: F401 -- GitError
    import ledger.verifier  # noqa: F401 -- CheckFailed
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
    from ledger import attempt, processes, protocol

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
    ]) + "\n"


#: Generated page -> its generator.
PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_page,
    "reference/cli.md": cli_page,
    "reference/errors.md": errors_page,
    "reference/attempt-protocol.md": protocol_page,
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
