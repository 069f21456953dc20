"""priority_classes: the escalation threshold and the editor's reason, per version

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 16:45:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('priority_classes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('escalate_below', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('reason', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('priority_classes', schema=None) as batch_op:
        batch_op.drop_column('reason')
        batch_op.drop_column('escalate_below')
