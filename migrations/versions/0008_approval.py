"""Approval before promotion: the state awaiting_approval and
its transitions (request_approval; approve, deny and abandon by the
operator; approve, deny and abandon on timeout by the system), the
approvals (ledger.approval: one open per campaign, a decision final, no
promotion without one), each class's approval policy
(campaign_class.approval), ledger_api.approve, deny and expire_approvals,
and claim_side_effect handing a waiting campaign's intents only to a
dispatcher that knows the state.

Revision ID: 0008_approval
Revises: 0007_security_event_per_reason
"""

from alembic import op

from ledger.db.migrations import Step

revision = '0008_approval'
down_revision = '0007_security_event_per_reason'
branch_labels = None
depends_on = None

step = Step(revision, files=(
    'state_machine.sql',
    'campaign.sql',
    'approval.sql',
    'api_helpers.sql',
    'api_reaper.sql',
    'api_verifier.sql',
    'api_dispatcher.sql',
    'api_operator.sql',
    'views.sql',
    'grants.sql',
))


def upgrade() -> None:
    step.upgrade(op.get_bind())


def downgrade() -> None:
    step.downgrade(op.get_bind())
