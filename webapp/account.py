"""`GET /api/v1/me`: whom a token belongs to, and whether they are an admin (the dashboard shows its Catalogue tab to
admins only; the admin endpoints check for themselves)."""

from __future__ import annotations

from apiflask import APIBlueprint

from webapp.auth import auth, current_user
from webapp.schemas import MeOut

bp = APIBlueprint("account", __name__, url_prefix="/api/v1", tag="Account")


@bp.get("/me")
@bp.auth_required(auth)
@bp.output(MeOut)
def me():
    """Who you are: your user name and whether you are an admin"""
    user = current_user()
    return {"name": user.name, "is_admin": bool(user.is_admin)}
