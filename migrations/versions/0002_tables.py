"""tables and invariant indexes

Revision ID: 0002_tables
Revises: 0001_roles_and_schemas
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0002_tables'
down_revision = '0001_roles_and_schemas'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0002_tables.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0002_tables.down.sql", as_owner=False)
