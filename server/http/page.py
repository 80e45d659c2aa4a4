"""The browser page's files and ``/healthz``: what every process serves, front included."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def file_handler(path: Path) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    return serve


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def register_page(app: web.Application) -> frozenset[str]:
    """``/healthz`` and the page's files; returns the page's paths, which need no token.

    One route per page file, not a static catch-all at "/": that would answer every unknown
    path itself (an empty, non-JSON 404 for GET, 405 for other methods), and no request path
    can name a file outside web/. Hidden files (an editor's swap file) are not served.
    """
    app.router.add_get("/healthz", healthz)
    pages = {"/": WEB_DIR / "index.html"}
    for path in sorted(WEB_DIR.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            pages[f"/{path.name}"] = path
    for route, path in pages.items():
        app.router.add_get(route, file_handler(path))
    return frozenset(pages)
