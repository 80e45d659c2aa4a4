"""The server's command line: ``serve`` runs it, ``worker`` is one worker behind a front."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from server.config import SettingsError, add_serve_arguments, settings_from
from server.deploy.engines import check_engines, load_engines
from server.deploy.runner import serve_tcp
from server.ops.logs import configure_logging


def _serve(args: argparse.Namespace) -> int:
    from server.deploy.tls import tls_context

    try:
        settings = settings_from(args)
        tls = tls_context(settings)
        check_engines(settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    shown_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"{'https' if tls else 'http'}://{shown_host}:{settings.port}/"
    if settings.workers > 1:
        from server.deploy.front import create_front_app, drain_front

        app = create_front_app(settings, args.passthrough)
        print(f"cosyrtc is running: open {url} ({settings.workers} workers)", flush=True)
        serve_tcp(app, settings.host, settings.port, drain_front, tls)
        return 0
    registry = load_engines(settings)
    from server.http.app import create_app, drain_sessions

    try:
        app = create_app(settings, registry)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"cosyrtc is running: open {url} (engines: {', '.join(registry.names)})", flush=True)
    serve_tcp(app, settings.host, settings.port, drain_sessions, tls)
    registry.close()
    return 0


def _worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings, worker=args.index)
    from server.deploy.worker import run_worker

    return run_worker(settings, args.index, args.socket)


PEER_HELP = "call a server with a WAV file and record the reply (python -m server peer -h)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the WebRTC inference server")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)
    # Listed for --help only: server/__main__.py hands ``peer`` to the peer package first.
    commands.add_parser("peer", help=PEER_HELP, add_help=False)
    worker = commands.add_parser("worker", help=argparse.SUPPRESS)
    add_serve_arguments(worker)
    worker.add_argument("--index", type=int, required=True)
    worker.add_argument("--socket", required=True)
    worker.set_defaults(run=_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # A front hands its own serve flags to the workers it starts.
    args.passthrough = argv[argv.index("serve") + 1 :] if "serve" in argv else []
    return args.run(args)
