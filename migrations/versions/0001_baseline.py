"""Ledger 0.1.0's schema, as released (ba4fed6): the tables, the state
machine, the role APIs, views and grants, frozen in migrations/sql/0001_baseline/.

Revision ID: 0001_baseline
Revises:
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0001_baseline'
down_revision = None
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'roles.sql',
    'meta_and_clock.sql',
    'state_machine.sql',
    'campaign.sql',
    'journal.sql',
    'attempt.sql',
    'observation.sql',
    'verification.sql',
    'outbox.sql',
    'security_event.sql',
    'sensor_tick.sql',
    'api_helpers.sql',
    'api_sensor.sql',
    'api_worker.sql',
    'api_reaper.sql',
    'api_verifier.sql',
    'api_dispatcher.sql',
    'api_operator.sql',
    'views.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())
    # As the administrator: database-level privileges (see meta_and_clock.sql).
    op.execute("SELECT ledger.secure_database()")


def downgrade() -> None:
    step.downgrade(op.get_bind())
