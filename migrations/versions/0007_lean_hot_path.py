"""lean hot path: cheaper clock, transitions and state check; batch claim and record

Revision ID: 0007_lean_hot_path
Revises: 0006_sensor_ticks
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0007_lean_hot_path'
down_revision = '0006_sensor_ticks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0007_lean_hot_path.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0007_lean_hot_path.down.sql", as_owner=False)
