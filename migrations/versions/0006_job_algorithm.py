"""A job's algorithm column is named for what it holds: jobs.kind -> jobs.algorithm (reinforce | ppo), values kept.

The column is renamed in place (ALTER TABLE ... RENAME, SQLite 3.25 and later) rather than by batch mode's copy of
the table: the copy drops `jobs`, and with SQLite's foreign keys on (webapp.db.make_engine) that deletes every job's
metrics, samples, events and checkpoints through their ON DELETE CASCADE.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _rename(old: str, new: str) -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.alter_column(old, new_column_name=new, existing_type=sa.String(length=20), existing_nullable=False)


def upgrade() -> None:
    _rename("kind", "algorithm")


def downgrade() -> None:
    _rename("algorithm", "kind")
