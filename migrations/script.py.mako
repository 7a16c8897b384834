"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from alembic import op

from ledger.migrations import apply_schema, run_sql

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Table changes first (migrations/sql/${up_revision}.up.sql, as the owner),
    # then the schema files whose functions, triggers or views this revision
    # changes, applied again; see CONTRIBUTING.md, "Working on the schema".
    run_sql(op.get_bind(), "${up_revision}.up.sql", as_owner=True)
    apply_schema(op.get_bind(), "grants.sql")


def downgrade() -> None:
    run_sql(op.get_bind(), "${up_revision}.down.sql", as_owner=False)
