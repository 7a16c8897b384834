"""trace context: campaign.trace_context, written by the open, in the campaigns view

Revision ID: 0003_trace_context
Revises: 0002_merge_queue
"""

from alembic import op

from ledger.db.migrations import apply_schema, run_sql

revision = '0003_trace_context'
down_revision = '0002_merge_queue'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The column, and the old signatures of the functions that gained
    # p_trace_context (migrations/sql/0003_trace_context.up.sql, as the owner);
    # then the files that define the helper, the open and the view, and the grants.
    run_sql(op.get_bind(), "0003_trace_context.up.sql", as_owner=True)
    apply_schema(op.get_bind(), "api_helpers.sql", "api_sensor.sql", "views.sql", "grants.sql")


def downgrade() -> None:
    run_sql(op.get_bind(), "0003_trace_context.down.sql", as_owner=False)
