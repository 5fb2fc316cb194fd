"""Aligner's errors: one base, `AlignerError`, for everything a user can fix.

The `aligner` command prints an `AlignerError` as one line, `aligner COMMAND: error: MESSAGE`, and exits with
status 2 (aligner/cli.py); anything else is a bug and keeps its traceback. Each subclass also derives from the
built-in exception it replaces, so code that catches `ValueError` or `RuntimeError` keeps working.
"""

from __future__ import annotations

import errno
import os


class AlignerError(Exception):
    """An error caused by the user's input or environment: printed as a message, never as a traceback."""


class ConfigError(AlignerError, ValueError):
    """A configuration that cannot be used; the message names each bad field and why."""


class PromptDataError(AlignerError, ValueError):
    """A prompt file that cannot be used; the message names the file, the line and the reason."""


class PreferenceDataError(PromptDataError):
    """A preference file that cannot be used; the message names the file, the line and the reason."""


class ModelFolderError(AlignerError, FileNotFoundError):
    """A model, tokenizer or checkpoint folder that is missing or is not what it should be."""


class GGUFImportError(AlignerError):
    """The GGUF file cannot be imported (ambiguous source, unsupported model, occupied output folder...)."""


class RewardError(AlignerError, RuntimeError):
    """A reward source that cannot be used or returned unusable values."""


class CriticError(AlignerError, RuntimeError):
    """A critic server that cannot be reached, refused a request or answered something unusable."""


class ServerUnavailableError(AlignerError, RuntimeError):
    """A reward or critic server that could not be reached for longer than its `unavailable_timeout_s`.

    `server` ("reward server" or "critic server"), `url` and `waited_s` (seconds waited) say which and how long."""

    def __init__(self, message: str, server: str = "", url: str = "", waited_s: float = 0.0):
        super().__init__(message)
        self.server, self.url, self.waited_s = server, url, waited_s


class RewardServerUnavailableError(ServerUnavailableError, RewardError):
    """The reward server stayed unreachable past `reward.unavailable_timeout_s`."""


class CriticServerUnavailableError(ServerUnavailableError, CriticError):
    """The critic server stayed unreachable past `critic.unavailable_timeout_s`."""


class ServerStartError(AlignerError, RuntimeError):
    """A child server that exited or did not become ready; the message names its log."""


class RunDirError(AlignerError, RuntimeError):
    """A run directory that does not fit the request (existing checkpoints without --resume, ...)."""


def disk_full_message(err: BaseException) -> str | None:
    """The words for an OSError of a full disk (ENOSPC, EDQUOT) wherever the write was, else None: the error's own
    text says only "Errno 28" and names a server path."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the disk is full ({os.strerror(err.errno)}): free space on the run folder's disk, then resume from the "
            "last checkpoint"
        )
    return None
