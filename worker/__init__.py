"""The training service's worker: Celery tasks that run training jobs as subprocesses and follow them into the
database (worker/celery_app.py, worker/runner.py). How it works and its settings: docs/service.md, "The worker"."""
