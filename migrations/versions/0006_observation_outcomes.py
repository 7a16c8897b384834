"""Observations have three outcomes (green, red, error: the check's own failure, which moves no campaign); open_after/confirm_after hysteresis in record_observation; the worker re-observes a campaign's target (ledger_api.reobserve) and a green re-observation dismisses the leased campaign, charging nothing

Revision ID: 0006_observation_outcomes
Revises: 0005_restart_grace
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0006_observation_outcomes'
down_revision = '0005_restart_grace'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'state_machine.sql',
    'observation.sql',
    'api_sensor.sql',
    'api_worker.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
