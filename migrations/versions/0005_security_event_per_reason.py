"""One security event per reason (issue 41): the same action reported again for a
generation is a retry only with the same reason, so each destination the egress
proxy refused is an event of its own.

Revision ID: 0005_security_event_per_reason
Revises: 0004_release_check
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0005_security_event_per_reason'
down_revision = '0004_release_check'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'api_worker.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
