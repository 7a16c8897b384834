"""read views for every role

Revision ID: 0005_read_views
Revises: 0004_write_api
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0005_read_views'
down_revision = '0004_write_api'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0005_read_views.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0005_read_views.down.sql", as_owner=False)
