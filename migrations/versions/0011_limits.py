"""Limits and budgets for agent fleets

Revision ID: 0011_limits
Revises: 0010_lean_cycle
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0011_limits'
down_revision = '0010_lean_cycle'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'state_machine.sql',
    'campaign.sql',
    'limits.sql',
    'api_helpers.sql',
    'api_sensor.sql',
    'api_worker.sql',
    'api_reaper.sql',
    'api_verifier.sql',
    'api_operator.sql',
    'views.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
