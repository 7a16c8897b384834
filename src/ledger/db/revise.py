"""Writing a revision: ``python -m ledger.db.revise new SLUG FILE...`` starts
one after the head (its module, its folder, and frozen copies of the named
schema files), ``python -m ledger.db.revise freeze REVISION [FILE...]``
copies the live files into it again after you changed them (every file it
froze, or the ones named). A released revision (migrations/released.txt) is
refused: history does not change. CONTRIBUTING.md, "Working on the schema".
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from ledger.db import migrations

TEMPLATE = '''"""{message}

Revision ID: {revision}
Revises: {down}
"""

from alembic import op

from ledger.db.migrations import Step

revision = {revision!r}
down_revision = {down!r}
branch_labels = None
depends_on = None

step = Step(revision, files=({files}))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
'''


def _ordered(names: list[str]) -> list[str]:
    unknown = sorted(set(names) - set(migrations.SCHEMA_FILES))
    if unknown:
        raise SystemExit(f"not schema files: {', '.join(unknown)} (see SCHEMA_FILES)")
    return [n for n in migrations.SCHEMA_FILES if n in names]


def new(slug: str, files: list[str], message: str) -> Path:
    """Start revision ``NNNN_slug`` after the head, freezing ``files``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{2,40}", slug):
        raise SystemExit("a slug is lower-case letters, digits and _ (3 to 41 characters)")
    down = migrations.head()
    revision = f"{int(down.split('_', 1)[0]) + 1:04d}_{slug}"
    ordered = _ordered(files)
    folder = migrations.migrations_dir() / "sql" / revision
    (folder / "schema").mkdir(parents=True)
    for name in ordered:
        shutil.copy2(migrations.schema_dir() / name, folder / "schema" / name)
    listed = "".join(f"\n    {name!r}," for name in ordered) + ("\n" if ordered else "")
    module = migrations.migrations_dir() / "versions" / f"{revision}.py"
    module.write_text(TEMPLATE.format(message=message, revision=revision, down=down, files=listed))
    return module


def freeze(revision: str, files: list[str]) -> list[str]:
    """Copy the live schema files into unreleased ``revision`` again."""
    if revision in migrations.released():
        raise SystemExit(f"{revision} is released: it never changes; start a new revision")
    module = migrations.load_revision_module(migrations.migrations_dir() / "versions" / f"{revision}.py")
    step = migrations.step_of(module)
    if step is None:
        raise SystemExit(f"{revision} declares no Step")
    names = _ordered(files) if files else list(step.files)
    missing = sorted(set(names) - set(step.files))
    if missing:
        raise SystemExit(f"{revision} does not freeze {', '.join(missing)}: add it to its files first")
    (step.folder / "schema").mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(migrations.schema_dir() / name, step.folder / "schema" / name)
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ledger.db.revise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    n = sub.add_parser("new", help="start a revision after the head")
    n.add_argument("slug")
    n.add_argument("files", nargs="*", help="schema files the revision changes")
    n.add_argument("-m", "--message", default="(say what this revision changes)")
    f = sub.add_parser("freeze", help="copy the live files into an unreleased revision again")
    f.add_argument("revision")
    f.add_argument("files", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "new":
        print(new(args.slug, args.files, args.message))
    else:
        print("froze " + ", ".join(freeze(args.revision, args.files)))


if __name__ == "__main__":
    main(sys.argv[1:])
