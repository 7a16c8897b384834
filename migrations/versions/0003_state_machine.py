"""states, transitions and the guard triggers

Revision ID: 0003_state_machine
Revises: 0002_tables
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0003_state_machine'
down_revision = '0002_tables'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0003_state_machine.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0003_state_machine.down.sql", as_owner=False)
