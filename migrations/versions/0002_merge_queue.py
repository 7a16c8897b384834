"""merge queue: promotions wait in order per target; merge batches; transition requeue

Revision ID: 0002_merge_queue
Revises: 0001_baseline
"""

from alembic import op

from ledger.db.migrations import apply_schema, run_sql

revision = '0002_merge_queue'
down_revision = '0001_baseline'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the transition row first (the contract tables take writes only here),
    # then the tables and the functions that use them (idempotent: a database
    # the baseline built from the current files has them already)
    run_sql(op.get_bind(), "0002_merge_queue.up.sql", as_owner=True)
    apply_schema(op.get_bind(), "merge_queue.sql", "api_verifier.sql", "api_dispatcher.sql", "api_operator.sql",
                 "grants.sql")


def downgrade() -> None:
    run_sql(op.get_bind(), "0002_merge_queue.down.sql", as_owner=True)
