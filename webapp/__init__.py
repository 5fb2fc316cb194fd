"""The training service's REST API (Flask + APIFlask); the Gradio dashboard (webapp/ui/, `aligner ui`) is its client.
`create_app` makes its process non-dumpable (`aligner.processes.hide_from_children`): other processes of its user,
the reward tries it starts among them, cannot read its /proc/PID/environ.

    flask --app webapp run                   # development server (threaded), http://127.0.0.1:5000/api/v1/docs
    gunicorn -k gthread --threads 8 -w 2 'webapp:create_app()'

Config (create_app's test_config, else the service's settings, webapp/settings.py: the environment variables and
their defaults are listed in docs/service.md, "Environment variables"):

    DATA_DIR               runs (DATA_DIR/runs/job_ID) and uploads (DATA_DIR/datasets); settings' data_dir
    DATABASE_URL           default webapp.db.database_url(): settings' database_url, else DATA_DIR/aligner.db
    MAX_CONTENT_LENGTH     largest request body (1 MiB); MAX_DATASET_SIZE for uploads (settings' max_upload_bytes,
                           256 MiB)
    JOB_QUEUE              an object with enqueue(job_id); default webapp.queues.CeleryQueue() (settings' broker_url)
    JOB_LIMITS             per-job caps over webapp.job_config's, e.g. {"model.num_threads": 8}, over settings' ones
    SSE_POLL_INTERVAL, SSE_HEARTBEAT_INTERVAL   seconds (0.25, 15)
    TRUSTED_PROXIES        proxies in front of the API (0): with N > 0 the client address (sign-in throttling) is
                           the one the Nth proxy from the API saw (X-Forwarded-For, werkzeug's ProxyFix)
    TRY_TIMEOUT_S          seconds a reward try (POST /rewards/try, a job's dry run) may run (120), then 422
    TRY_THREADS            torch threads all tries of this process may use at once (settings' try_threads), then 503
    WORKER_DEVICE_MEMORY_GB  one worker device's memory in GB; None: measured here (webapp/memory_plan.py). A job
                           whose estimate per process exceeds it is refused with 422

Limits (webapp/limits.py, docs/security.md "Limits"), each defaulting to its field of the settings:

    SIGNIN_FAILURE_LIMIT         requests without a valid token per client address, then 429
    RATELIMIT_STORAGE_URI        where those are counted (per process, or e.g. "redis://host:6379/2" for all
                                 processes). RATELIMIT_ENABLED (True), RATELIMIT_IN_MEMORY_FALLBACK_ENABLED (True) and
                                 Flask-Limiter's other keys apply too
    MAX_ACTIVE_JOBS_PER_USER     queued + running + cancelling jobs, then 429
    MAX_DATASET_BYTES_PER_USER   all of a user's uploads, then 413
    MAX_EVENT_STREAMS_PER_USER   open event streams per API process, then 429
    MAX_TRIES_PER_USER           reward tries running per API process, then 429
    MAX_DOWNLOADS_PER_USER       checkpoint and policy downloads being built or sent per API process, then 429

The Flask pieces are imported inside create_app: the worker imports webapp.db without needing them.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

API_TITLE = "Aligner"
API_DESCRIPTION = (
    "Train language models with REINFORCE / RLOO or PPO (`algorithm: ppo`) as jobs: submit a config, follow its "
    "metrics, samples and events, download the aligned policy. Every endpoint but /health needs "
    "`Authorization: Bearer TOKEN` (`aligner token create --user NAME`). A job names what it uses from the "
    "catalogue (models, reward functions, servers) and your datasets; admins manage the catalogue. "
    'Errors are `{"message": ..., "errors": {field: [reasons]}}`.'
)


def _version() -> str:
    try:
        return metadata.version("aligner")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def create_app(test_config: dict[str, Any] | None = None):
    """The API app: config (the keys and their environment variables: this module's docstring), database, job queue,
    limits, error handling, blueprints, OpenAPI at /api/v1/openapi.json, its docs page at /api/v1/docs (served
    offline: webapp/docs_assets.py)."""
    from apiflask import APIFlask
    from werkzeug.middleware.proxy_fix import ProxyFix

    from aligner.processes import hide_from_children
    from webapp import (
        account,
        admin,
        catalogue_api,
        datasets,
        docs_assets,
        errors,
        health,
        jobs,
        limits,
        openapi,
        results,
        rewards_try,
    )
    from webapp.db import database_url
    from webapp.extensions import db
    from webapp.private import private_data_dir, private_files
    from webapp.queues import CeleryQueue
    from webapp.rewards_try import TRY_TIMEOUT_S
    from webapp.settings import service_settings

    # The API's environment holds the database and broker credentials; the reward tries it starts run as its user.
    hide_from_children()
    version = _version()
    app = APIFlask(
        __name__,
        title=API_TITLE,
        version=version,
        spec_path="/api/v1/openapi.json",
        docs_path="/api/v1/docs",
        docs_oauth2_redirect_path="/api/v1/docs/oauth2-redirect",
    )
    app.config.from_mapping(
        DATA_DIR=str(service_settings().data_dir),
        DATABASE_URL=None,
        MAX_CONTENT_LENGTH=1024 * 1024,
        MAX_DATASET_SIZE=service_settings().max_upload_bytes,
        JOB_QUEUE=None,
        JOB_LIMITS=None,
        SSE_POLL_INTERVAL=0.25,
        SSE_HEARTBEAT_INTERVAL=15.0,
        TRY_TIMEOUT_S=TRY_TIMEOUT_S,
        TRUSTED_PROXIES=service_settings().trusted_proxies,
        TRY_THREADS=service_settings().try_threads,
        WORKER_DEVICE_MEMORY_GB=service_settings().worker_device_memory_gb,
        **limits.config_defaults(),
        API_VERSION=version,
        DESCRIPTION=API_DESCRIPTION,
        TAGS=[
            {"name": "Jobs", "description": "Training jobs and their life cycle."},
            {"name": "Job results", "description": "Metrics, samples, checkpoints, the policy, live events."},
            {"name": "Datasets", "description": "Uploaded prompt files: yours, and those an admin shared."},
            {"name": "Catalogue", "description": "Models, reward functions and servers jobs may use (admins add)."},
            {"name": "Admin", "description": "Every user's jobs (admins only)."},
            {"name": "Account", "description": "Who the token belongs to."},
            {"name": "Health", "description": "Liveness of the API and its database."},
        ],
    )
    if test_config:
        app.config.update(test_config)
    private_files()  # the API process's uploads and folders are its user's only (webapp/private.py)
    data_dir = private_data_dir(Path(app.config["DATA_DIR"]).expanduser().resolve())
    app.config["DATA_DIR"] = str(data_dir)
    if not app.config["DATABASE_URL"]:
        app.config["DATABASE_URL"] = database_url(data_dir)

    hops = app.config["TRUSTED_PROXIES"]
    if hops:
        # Each proxy appends the address it got the request from: the Nth from the right is the client as the
        # outermost trusted proxy saw it; anything further left came from the client and is ignored.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops)
    db.init_app(app)
    app.extensions["aligner_queue"] = app.config["JOB_QUEUE"] or CeleryQueue()
    authenticated = (jobs, results, rewards_try, datasets, catalogue_api, admin, account)
    limits.init_app(app, authenticated=[module.bp for module in authenticated])  # first: throttled costs least
    errors.init_app(app)
    for module in (health, *authenticated):
        app.register_blueprint(module.bp)
    docs_assets.init_app(app)
    openapi.init_app(app)
    return app
