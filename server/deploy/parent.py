"""A child process's life tied to its parent's: workers and the model host exit with the front."""

from __future__ import annotations

import ctypes
import logging
import signal

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to send SIGTERM when the front exits, so no child outlives it."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        log.warning("cannot tie this process's life to the front's on this platform")
