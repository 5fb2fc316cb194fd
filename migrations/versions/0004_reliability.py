"""Reliability: when a queued job was last sent to the broker (the sweep re-sends what a broker lost), the GPUs a
job asks for and the ones its run holds.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("queued_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("num_gpus", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("devices", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("devices")
        batch.drop_column("num_gpus")
        batch.drop_column("queued_at")
