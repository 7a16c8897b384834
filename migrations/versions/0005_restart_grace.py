"""A database restart or failover costs no lease: leases in flight
(campaigns' and verifications') get their whole length again from when the
server is back, once per server incarnation, journaled
(ledger.restart_grace); a verification keeps the lease length its holder
asked for.

Revision ID: 0005_restart_grace
Revises: 0004_release_check
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0005_restart_grace'
down_revision = '0004_release_check'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'verification.sql',
    'api_helpers.sql',
    'api_worker.sql',
    'api_reaper.sql',
    'api_verifier.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
