"""A deleted job stays as a tombstone: jobs.deleted_at (NULL: not deleted), the time its owner or an admin deleted it.

Added in place (ALTER TABLE ... ADD COLUMN, no copy of the table): a copy drops `jobs`, and with SQLite's foreign keys
on (webapp.db.make_engine) that deletes every job's rows through their ON DELETE CASCADE (see 0006).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN in place: SQLite 3.35 and later (Python 3.11's is newer).
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.drop_column("deleted_at")
