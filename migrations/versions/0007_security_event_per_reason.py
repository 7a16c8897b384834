"""One security event per reason (issue 41): the same action reported again for a
generation is a retry only with the same reason, so each destination the egress
proxy refused is an event of its own.

Revision ID: 0007_security_event_per_reason
Revises: 0006_observation_outcomes
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0007_security_event_per_reason'
down_revision = '0006_observation_outcomes'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'api_worker.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
