"""The 503s that refuse a new session, the same from a worker and from the front.

Each says when to come back (``Retry-After``), so clients and load balancers retry
instead of failing the call.
"""

from __future__ import annotations

from signaling.errors import ApiError

RETRY_AFTER_SECONDS = 2


def unavailable(code: str, message: str, retry_after: int = RETRY_AFTER_SECONDS) -> ApiError:
    return ApiError(503, code, message, headers={"Retry-After": str(retry_after)})


def draining() -> ApiError:
    return unavailable("draining", "The server is shutting down and takes no new sessions.")


def at_capacity() -> ApiError:
    return unavailable("at_capacity", "The server is at capacity; retry shortly.")


CLIENT_RETRY_AFTER_SECONDS = 5


def client_limit(limit: int) -> ApiError:
    """429: the client holds its share of sessions (live, or still connecting)."""
    return ApiError(
        429,
        "client_session_limit",
        f"Your address holds {limit} sessions already (live or still connecting); end one "
        "or retry when one has ended.",
        headers={"Retry-After": str(CLIENT_RETRY_AFTER_SECONDS)},
    )
