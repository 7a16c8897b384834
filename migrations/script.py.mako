"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from alembic import op

from ledger.db.migrations import Step

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None

# migrations/sql/${up_revision}/: before.sql (ALTERs on what exists), schema/
# (this revision's copies of the schema files it changes, applied in this
# order: `python -m ledger.db.revise freeze ${up_revision} FILE...`), after.sql,
# down.sql. CONTRIBUTING.md, "Working on the schema".
step = Step(revision, files=())


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
