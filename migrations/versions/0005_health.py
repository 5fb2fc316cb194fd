"""Run health: the alarms firing on a job (a JSON list of rule names); `paused` is a new status value (a string
column: no schema change). A validation sample's gold rewards (validation.extra_rewards: {name: value}).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("alarms", sa.JSON(), nullable=False, server_default="[]"))
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("extra_rewards", sa.JSON(), nullable=True))


def downgrade() -> None:
    # The older code knows no `paused`: such a job becomes cancelled, which resumes the same way.
    op.execute("UPDATE jobs SET status = 'cancelled' WHERE status = 'paused'")
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("extra_rewards")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("alarms")
