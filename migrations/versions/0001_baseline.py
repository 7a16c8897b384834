"""baseline: the schema as src/ledger/db/sql defines it

Revision ID: 0001_baseline
Revises:
"""

from alembic import op

from ledger.db.migrations import apply_schema, run_sql

revision = '0001_baseline'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    apply_schema(op.get_bind())
    # As the administrator: database-level privileges (see meta_and_clock.sql).
    op.execute("SELECT ledger.secure_database()")


def downgrade() -> None:
    run_sql(op.get_bind(), "0001_baseline.down.sql", as_owner=False)
