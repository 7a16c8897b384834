"""A process that waits to start -- its host or its configuration is not
ready: no sandbox, a bad ledger.toml, a repository that is not there -- says
why in the registry: ledger.process.not_ready, p_not_ready (default NULL) on
every report_*_process, ledger_api.processes.not_ready (a last column).

Revision ID: 0009_process_not_ready
Revises: 0008_approval
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0009_process_not_ready'
down_revision = '0008_approval'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'process.sql',
    'views.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
