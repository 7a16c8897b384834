"""roles, schemas, settings and the clock

Revision ID: 0001_roles_and_schemas
Revises: 
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0001_roles_and_schemas'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0001_roles_and_schemas.up.sql", as_owner=False)


def downgrade() -> None:
    run_sql(op.get_bind(), "0001_roles_and_schemas.down.sql", as_owner=False)
