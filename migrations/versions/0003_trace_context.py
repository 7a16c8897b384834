"""Ledger 0.2.0's head: the open's W3C trace context.

As 0.2.0 shipped it, this revision re-applied the live schema files; when the
history was frozen (0.3.0) its changes went into 0002, which builds 0.2.0's
schema whole, so this revision has nothing left to do. A 0.2.0 database is
at this revision already; a 0.1.0 database passes through it.

Revision ID: 0003_trace_context
Revises: 0002_merge_queue
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0003_trace_context'
down_revision = '0002_merge_queue'
branch_labels = None
depends_on = None

step = Step(revision)


def upgrade() -> None:
    step.upgrade(op.get_bind())  # (nothing: see above)


def downgrade() -> None:
    pass  # nothing to undo
