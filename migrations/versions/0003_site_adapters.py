"""relabel_examples and site_models: site adaptation from operator relabels (issue 14)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 16:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('relabel_examples',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('request_id', sa.String(length=64), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.Column('level', sa.Integer(), nullable=False),
    sa.Column('general_level', sa.Integer(), nullable=False),
    sa.Column('features', sa.Text(), nullable=False),
    sa.Column('feature_version', sa.Integer(), nullable=False),
    sa.Column('general_fingerprint', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_relabel_examples'))
    )
    with op.batch_alter_table('relabel_examples', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_relabel_examples_request_id'), ['request_id'], unique=False)
    op.create_table('site_models',
    sa.Column('version', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('created', sa.Float(), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('passed', sa.Boolean(), nullable=False),
    sa.Column('verdict', sa.Text(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('general_fingerprint', sa.String(length=64), nullable=False),
    sa.Column('n_train', sa.Integer(), nullable=False),
    sa.Column('n_holdout', sa.Integer(), nullable=False),
    sa.Column('figures', sa.Text(), nullable=False),
    sa.Column('promoted_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('version', name=op.f('pk_site_models'))
    )


def downgrade() -> None:
    op.drop_table('site_models')
    with op.batch_alter_table('relabel_examples', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_relabel_examples_request_id'))
    op.drop_table('relabel_examples')
