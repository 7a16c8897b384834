"""operator surface: the acting role on every journal event, retry_now

Revision ID: 0008_operator_surface
Revises: 0007_lean_hot_path
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0008_operator_surface'
down_revision = '0007_lean_hot_path'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0008_operator_surface.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0008_operator_surface.down.sql", as_owner=False)
