"""Ledger 0.2.0's schema (53cfadf), from 0.1.0's: the merge queue and merge
batches; attempts charged by the transition table (release, requeue); a
class's quorum of verifiers, heartbeat and pause; why a campaign waits; the
candidate's diff and published ref; browser sessions, bulk jobs, class
events and the process registry; bounded input; the open's trace context
(0003 as 0.2.0 shipped it re-applied the live files; frozen here instead).

Revision ID: 0002_merge_queue
Revises: 0001_baseline
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0002_merge_queue'
down_revision = '0001_baseline'
branch_labels = None
depends_on = None

# No down.sql: undoing 0.2.0's tables would lose what was written since.
step = Step(revision, files=(
    'state_machine.sql',
    'campaign.sql',
    'journal.sql',
    'attempt.sql',
    'observation.sql',
    'verification.sql',
    'outbox.sql',
    'merge_queue.sql',
    'security_event.sql',
    'web.sql',
    'class_event.sql',
    'api_helpers.sql',
    'api_sensor.sql',
    'api_worker.sql',
    'api_verifier.sql',
    'api_dispatcher.sql',
    'api_operator.sql',
    'process.sql',
    'views.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
