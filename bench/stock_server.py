"""A stock aiortc echo server, written the aiortc examples' way, as a baseline.

Single process, aiortc's own audio path (jitter buffer with prefetch 4, PyAV decode and
encode), the caller's track relayed straight back. Changed from the examples only where
this machine requires it: no STUN server and loopback host candidates.

    .venv/bin/python -m bench.stock_server --port 8081
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay

from media.rtc.compat import restrict_host_addresses


def create_app() -> web.Application:
    peers: set[RTCPeerConnection] = set()
    relay = MediaRelay()

    async def offer(request: web.Request) -> web.Response:
        params = await request.json()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        peers.add(pc)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await pc.close()
                peers.discard(pc)

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":
                pc.addTrack(relay.subscribe(track))

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            @channel.on("message")
            def on_message(message) -> None:
                if isinstance(message, str) and message.startswith("ping"):
                    channel.send("pong" + message[4:])

        await pc.setRemoteDescription(RTCSessionDescription(params["sdp"], params["type"]))
        await pc.setLocalDescription(await pc.createAnswer())
        body = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
        return web.Response(content_type="application/json", text=json.dumps(body))

    async def on_shutdown(app: web.Application) -> None:
        await asyncio.gather(*(pc.close() for pc in peers))
        peers.clear()

    app = web.Application()
    app.router.add_post("/offer", offer)
    app.on_shutdown.append(on_shutdown)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    restrict_host_addresses(["127.0.0.1"])
    web.run_app(create_app(), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
