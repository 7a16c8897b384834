"""Ledger 0.3.0: every process greets the database with its release and
schema (ledger_api.hello), and the database refuses code it cannot serve;
the oldest code it serves in ledger.meta; the reaper role a member of the
reader role (as every runtime role), so that it may greet.

Revision ID: 0004_release_check
Revises: 0003_trace_context
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0004_release_check'
down_revision = '0003_trace_context'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'roles.sql',
    'compatibility.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
