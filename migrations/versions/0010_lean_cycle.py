"""The write path costs what its guarantees cost: the campaign's document bounds checked by the guard where a document is written (not as CHECKs on every UPDATE), the merge queue's trigger only where a campaign leaves attempted or verified, the claim rotation's probe on claim order

Revision ID: 0010_lean_cycle
Revises: 0009_process_not_ready
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0010_lean_cycle'
down_revision = '0009_process_not_ready'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'campaign.sql',
    'merge_queue.sql',
    'api_worker.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
