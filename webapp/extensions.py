"""The database extension of the Flask app: one engine per app, one SQLAlchemy session per request.

    db = Database()          # module level; create_app calls db.init_app(app)
    db.session               # the request's session (opened on first use, closed at teardown)
    db.session_factory       # new sessions outside the request's, e.g. for each poll of an event stream

Views commit explicitly; whatever a request leaves uncommitted is rolled back when its app context ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app, g
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from webapp.db import Base, make_engine, make_session_factory

EXTENSION = "aligner_db"


@dataclass
class _State:
    engine: Engine
    session_factory: sessionmaker[Session]


class Database:
    def __init__(self, app: Flask | None = None):
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        engine = make_engine(app.config["DATABASE_URL"])
        app.extensions[EXTENSION] = _State(engine, make_session_factory(engine))
        app.teardown_appcontext(self._close_session)

    @staticmethod
    def _state() -> _State:
        return current_app.extensions[EXTENSION]

    @property
    def engine(self) -> Engine:
        return self._state().engine

    @property
    def session_factory(self) -> sessionmaker[Session]:
        return self._state().session_factory

    @property
    def session(self) -> Session:
        if "aligner_session" not in g:
            g.aligner_session = self.session_factory()
        return g.aligner_session

    def close_session(self) -> None:
        """End the request's session now (rolling back anything uncommitted), e.g. before a long stream."""
        self._close_session(None)

    @staticmethod
    def _close_session(_exc: BaseException | None) -> None:
        session = g.pop("aligner_session", None)
        if session is not None:
            session.close()

    def create_all(self) -> None:
        """Create the tables directly from the models (tests; deployments run `aligner db upgrade`)."""
        Base.metadata.create_all(self.engine)


db = Database()
