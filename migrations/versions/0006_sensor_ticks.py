"""sensor ticks: one observation run per scheduled tick across processes

Revision ID: 0006_sensor_ticks
Revises: 0005_read_views
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0006_sensor_ticks'
down_revision = '0005_read_views'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0006_sensor_ticks.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0006_sensor_ticks.down.sql", as_owner=False)
