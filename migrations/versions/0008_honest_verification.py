"""honest verification: refused candidates, dismissal of exhausted campaigns,
landed promotion commits, sensor registration

Revision ID: 0008_honest_verification
Revises: 0007_lean_hot_path
"""

from alembic import op

from ledger.migrations import run_sql

revision = '0008_honest_verification'
down_revision = '0007_lean_hot_path'
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(op.get_bind(), "0008_honest_verification.up.sql", as_owner=True)


def downgrade() -> None:
    run_sql(op.get_bind(), "0008_honest_verification.down.sql", as_owner=False)
