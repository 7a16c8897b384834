"""the SECURITY DEFINER write API and its grants

Revision ID: 0004_write_api
Revises: 0003_state_machine
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0004_write_api'
down_revision = '0003_state_machine'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0004_write_api.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0004_write_api.down.sql", as_owner=False)
