"""the fence holds against every writer: liveness in the write, no NULL loophole,
intents die with their generation, idempotent endings, bounded numbers

Revision ID: 0008_fence
Revises: 0007_lean_hot_path
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0008_fence'
down_revision = '0007_lean_hot_path'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0008_fence.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0008_fence.down.sql", as_owner=True)
