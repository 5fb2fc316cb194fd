"""The service's environment variables (webapp/settings.py): read once into one object, documented in one table."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from aligner.errors import ConfigError
from webapp.settings import ServiceSettings, markdown_table, service_settings

ROOT = Path(__file__).resolve().parents[2]


def test_without_an_environment_every_field_has_its_default():
    settings = ServiceSettings.from_environ({})
    assert settings == ServiceSettings() and settings.given == frozenset()
    assert (settings.data_dir, settings.database_url, settings.broker_url, settings.queue) == (
        Path("aligner_data"), None, "redis://127.0.0.1:6379/0", "aligner"
    )  # fmt: skip
    assert (settings.cancel_grace, settings.visibility_timeout, settings.lease_timeout, settings.max_attempts) == (
        60.0, 43200, 60.0, 3
    )  # fmt: skip
    assert settings.trainer_python == sys.executable and settings.device_lock_dir is None
    assert (settings.max_active_jobs, settings.max_dataset_bytes) == (4, 1024**3)
    assert settings.signin_limit == "10 per minute"


def test_values_are_parsed_and_an_empty_one_reads_as_its_variable_always_did():
    environ = {
        "ALIGNER_DATA_DIR": "/srv/aligner",
        "ALIGNER_LEASE_TIMEOUT": "12.5",
        "ALIGNER_MAX_ATTEMPTS": "5.0",  # the worker has always read its counts as numbers
        "ALIGNER_MAX_ACTIVE_JOBS": "7",
        "ALIGNER_DEVICE_LOCK_DIR": "/run/locks",
        "ALIGNER_DATABASE_URL": "",  # empty: unset, SQLite in the data folder
        "ALIGNER_CANCEL_GRACE": "",
        "ALIGNER_QUEUE": "",  # empty: a value of its own, as it always was
    }
    settings = ServiceSettings.from_environ(environ)
    assert settings.data_dir == Path("/srv/aligner") and settings.device_lock_dir == Path("/run/locks")
    assert (settings.lease_timeout, settings.max_attempts, settings.max_active_jobs) == (12.5, 5, 7)
    assert settings.database_url is None and settings.cancel_grace == 60.0 and settings.queue == ""
    assert settings.is_set("database_url") and settings.is_set("queue") and not settings.is_set("broker_url")


@pytest.mark.parametrize(("name", "value"), [("ALIGNER_LEASE_TIMEOUT", "soon"), ("ALIGNER_MAX_TRIES", "1.5")])
def test_a_malformed_number_is_an_error_naming_its_variable(name, value):
    with pytest.raises(ConfigError, match=rf"{name}='{value}' is not valid: expected something like"):
        ServiceSettings.from_environ({name: value})


def test_the_settings_are_read_once_until_the_cache_is_cleared(monkeypatch):
    monkeypatch.setenv("ALIGNER_QUEUE", "first")
    assert service_settings().queue == "first"
    monkeypatch.setenv("ALIGNER_QUEUE", "second")
    assert service_settings() is service_settings() and service_settings().queue == "first"
    service_settings.cache_clear()
    assert service_settings().queue == "second"


def test_the_docs_table_is_the_settings_table():
    docs = (ROOT / "docs" / "service.md").read_text()
    section = docs[docs.index("## Environment variables") :]
    start = section.index("| variable | default | what |")
    assert section[start : start + len(markdown_table())] == markdown_table(), "run: python -m webapp.settings"


def test_no_other_service_module_reads_the_environment():
    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[|environ\.get\(")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in ("webapp", "worker")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "settings.py" or path.parent.name != "webapp"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert found == []


def test_the_worker_device_memory_is_a_positive_number_of_gb_or_unset():
    assert ServiceSettings.from_environ({"ALIGNER_WORKER_DEVICE_MEMORY_GB": "79.6"}).worker_device_memory_gb == 79.6
    assert ServiceSettings.from_environ({"ALIGNER_WORKER_DEVICE_MEMORY_GB": ""}).worker_device_memory_gb is None
    for bad in ("0", "-8", "inf", "lots"):
        with pytest.raises(ConfigError, match="ALIGNER_WORKER_DEVICE_MEMORY_GB"):
            ServiceSettings.from_environ({"ALIGNER_WORKER_DEVICE_MEMORY_GB": bad})
