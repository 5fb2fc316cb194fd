"""The catalogue of what jobs may use: models, reward functions, reward and critic servers; shared datasets and
their sizes (for the per-user quota).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _named_table(name: str, *columns: sa.Column) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        *columns,
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )


def upgrade() -> None:
    _named_table(
        "catalogue_models",
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("architecture", sa.String(length=200), nullable=False),
        sa.Column("num_parameters", sa.BigInteger(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
    )
    _named_table("reward_functions", sa.Column("target", sa.String(length=300), nullable=False))
    _named_table(
        "server_endpoints",
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("model_name", sa.String(length=100), nullable=False),
    )
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("size_bytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("size_bytes")
        batch.drop_column("shared")
    for name in ("server_endpoints", "reward_functions", "catalogue_models"):
        op.drop_table(name)
