"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from alembic import op

from ledger.migrations import run_sql

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "${up_revision}.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "${up_revision}.down.sql", as_owner=False)
