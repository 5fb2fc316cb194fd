"""`GET /api/v1/health` (no token): the API answers and its database is reachable. Why the database cannot be
reached goes to the API's log, never into the answer (the driver's error names hosts, users, databases)."""

from __future__ import annotations

from apiflask import APIBlueprint
from flask import current_app
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from webapp.extensions import db
from webapp.schemas import HealthOut

UNHEALTHY = {"schema": HealthOut}
DATABASE_UNAVAILABLE = "database unavailable"

bp = APIBlueprint("health", __name__, url_prefix="/api/v1", tag="Health")


@bp.get("/health")
@bp.output(HealthOut)
@bp.doc(responses={503: {"description": "The database is unreachable", "content": {"application/json": UNHEALTHY}}})
def health():
    """Health check: 200 when the database answers, 503 when not"""
    version = current_app.config["API_VERSION"]
    try:
        db.session.execute(text("SELECT 1"))
    except SQLAlchemyError:
        # The driver's error names the host, the database and the user: the operator reads it in the log.
        current_app.logger.exception("health check: the database cannot be reached")
        return {"status": "error", "database": DATABASE_UNAVAILABLE, "version": version}, 503
    return {"status": "ok", "database": "ok", "version": version}
