"""The server's command line: ``serve`` runs it, ``host`` runs a model host, ``worker`` is one
worker behind a front."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from server.config import Settings, SettingsError, add_serve_arguments, settings_from
from server.deploy.engines import check_engines, load_engines
from server.ops.logs import configure_logging

if TYPE_CHECKING:
    from aiohttp import web

    from server.deploy.runner import Drain

# Each command imports what it runs, so the model host, which the front restarts when it
# dies, starts without loading the HTTP and WebRTC stack it never serves.


def _serve(args: argparse.Namespace) -> int:
    from server.deploy.cluster import with_cluster_defaults
    from server.deploy.runner import serve_tcp
    from server.deploy.tls import tls_context
    from server.http.routes import node_prefix

    try:
        settings = settings_from(args)
        tls = tls_context(settings)
        check_engines(settings)
        settings = with_cluster_defaults(settings, https=tls is not None)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    shown_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"{'https' if tls else 'http'}://{shown_host}:{settings.port}/"
    if settings.workers > 1:
        from server.deploy.front import create_front_app, drain_front

        worker_args = [
            *args.passthrough,
            *(["--node-id", settings.node_id] if settings.redis else []),
        ]
        app = create_front_app(settings, worker_args)
        drain = join_cluster(app, settings, drain_front)
        print(f"cosyrtc is running: open {url} ({settings.workers} workers)", flush=True)
        serve_tcp(app, settings.host, settings.port, drain, tls)
        return 0
    registry = load_engines(settings)
    from server.http.app import create_app, drain_sessions

    try:
        app = create_app(settings, registry, id_prefix=node_prefix(settings.node_id))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    drain = join_cluster(app, settings, drain_sessions)
    print(f"cosyrtc is running: open {url} (engines: {', '.join(registry.names)})", flush=True)
    serve_tcp(app, settings.host, settings.port, drain, tls)
    registry.close()
    return 0


def join_cluster(app: web.Application, settings: Settings, drain: Drain) -> Drain:
    """With ``--redis``, make ``app`` a node of the cluster; the drain it gets then tells the
    other nodes first (the node takes no new sessions from the moment SIGTERM arrives)."""
    if settings.redis is None or settings.node_id is None:
        return drain
    from server.deploy.cluster import Cluster
    from server.deploy.cluster_routes import attach_cluster
    from server.http.node import NODE_KEY
    from server.http.observability import METRICS_KEY

    node = app[NODE_KEY]
    cluster = Cluster(settings.redis, settings.node_id, node)
    attach_cluster(app, cluster, settings, app[METRICS_KEY].registry)

    async def drain_as_a_node(app: web.Application) -> None:
        node.stop_admitting()
        await cluster.publish()
        await drain(app)

    return drain_as_a_node


def _worker(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings, worker=args.index)
    from server.deploy.worker import run_worker

    return run_worker(settings, args.index, args.socket)


def _host(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
        check_engines(settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    from server.deploy.host import run_host

    return run_host(settings, args.socket, args.with_parent)


PEER_HELP = "call a server with a WAV file and record the reply (python -m server peer -h)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the WebRTC inference server")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)
    # Listed for --help only: server/__main__.py hands ``peer`` to the peer package first.
    commands.add_parser("peer", help=PEER_HELP, add_help=False)
    host = commands.add_parser(
        "host",
        help="run a model host: the hostable engines, served to workers over a Unix socket",
    )
    add_serve_arguments(host)
    host.add_argument("--socket", required=True, help="the Unix socket to listen on")
    host.add_argument("--with-parent", action="store_true", help=argparse.SUPPRESS)
    host.set_defaults(run=_host)
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
