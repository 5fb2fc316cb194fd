"""Bearer-token authentication: `Authorization: Bearer alg_...` (tokens come from `aligner token create`).

@bp.auth_required(auth)     # on a view; 401 without a valid token
require_admin()            # in such a view: 403 unless the user is an admin
current_user()              # the token's User inside such a view
token_user()                # the request's token's User or None, before any view (failed sign-in throttling)
request_token()             # the token itself, for a view that outlives its sign-in (an event stream re-checks it)

A token is looked up once per request (the result kept in flask.g), however many of these ask.
"""

from __future__ import annotations

from apiflask import HTTPTokenAuth
from flask import g

from webapp.db import User, user_for_token
from webapp.errors import abort_fields
from webapp.extensions import db

auth = HTTPTokenAuth(
    scheme="Bearer",
    description="A token from `aligner token create --user NAME`, sent as `Authorization: Bearer TOKEN`.",
)


@auth.verify_token
def _verify_token(token: str) -> User | None:
    return _user_of(token)


def _user_of(token: str) -> User | None:
    if "aligner_signin" in g and g.aligner_signin[0] == token:
        return g.aligner_signin[1]
    user = user_for_token(db.session, token) if token else None
    if user is not None:
        db.session.commit()  # records the token's last use
    g.aligner_signin = (token, user)
    return user


def request_token() -> str:
    """The request's bearer token ("" when it sends none)."""
    return getattr(auth.get_auth(), "token", None) or ""


def token_user() -> User | None:
    """The user of the request's bearer token when it is valid (known, unexpired, unrevoked), else None."""
    return _user_of(request_token())


def current_user() -> User:
    return auth.current_user


def require_admin() -> User:
    """The current user when an admin (operator); 403 for anyone else."""
    user = current_user()
    if not user.is_admin:
        abort_fields(403, "only an admin may do this (aligner token create --admin)")
    return user
