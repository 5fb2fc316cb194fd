"""Celery workers that run training jobs (the training-service issue)."""
