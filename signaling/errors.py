"""The API's error shape: ``{"error": code, "message": sentence}`` with the right status.

Whatever refuses a request (a malformed offer, a full server) raises :class:`ApiError`;
``server.http.errors`` renders it, so a client always gets a code it can branch on and a
sentence a person can read.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web


class ApiError(Exception):
    """An error response with a stable machine-readable ``code``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return web.json_response(
            {"error": self.code, "message": self.message},
            status=self.status,
            headers=self.headers,
        )
