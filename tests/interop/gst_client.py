"""A WebRTC client built on GStreamer's webrtcbin (libnice ICE, GStreamer's DTLS), not aiortc.

Runs under Debian's ``/usr/bin/python3``, whose PyGObject and GStreamer bindings are built
for it (the project's venv stays free of them), and needs nothing beyond the standard
library and ``gi``. It plays a raw s16le 48 kHz mono file in real time to the server,
records what comes back (``--mode offer``), and prints one JSON report on stdout:

- ``--mode whip``: a ``sendonly`` publisher over WHIP (RFC 9725), candidates trickled with
  PATCH as libnice finds them, as GStreamer's ``whipsink`` does;
- ``--mode offer``: a ``sendrecv`` call over ``POST /offer``, candidates in the offer.

Before hanging up it reads the server's view of the session (``GET /sessions/{id}``) into
the report, so the test can check the frames the server counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

OPUS_CAPS = "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000"
RECEIVE_CHAIN = (
    "rtpopusdepay ! opusdec plc=true ! audioconvert ! audioresample ! "
    "audio/x-raw,format=S16LE,rate=48000,channels=1 ! filesink location={path}"
)


def http(method: str, url: str, body: bytes | None = None, **headers: str) -> tuple[int, Any, str]:
    """One request; returns status, headers and body text (errors included)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


class Client:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.report: dict[str, Any] = {"mode": opts.mode, "states": []}
        self.loop = GLib.MainLoop()
        self.resource: str | None = None
        self.etag = "*"
        self.session_id: str | None = None
        self.posted = threading.Event()
        self.pending_candidates: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        source = (
            f"filesrc location={opts.send} ! rawaudioparse format=pcm pcm-format=s16le "
            "sample-rate=48000 num-channels=1 ! identity sync=true ! audioconvert ! "
            f"audioresample ! opusenc ! rtpopuspay pt=111 ! {OPUS_CAPS} ! queue ! webrtc."
        )
        self.pipeline = Gst.parse_launch(f"webrtcbin name=webrtc bundle-policy=max-bundle {source}")
        self.webrtc = self.pipeline.get_by_name("webrtc")
        direction = (
            GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY
            if opts.mode == "whip"
            else GstWebRTC.WebRTCRTPTransceiverDirection.SENDRECV
        )
        self.webrtc.connect("on-negotiation-needed", self.on_negotiation_needed)
        self.webrtc.connect("on-ice-candidate", self.on_ice_candidate)
        self.webrtc.connect("pad-added", self.on_pad_added)
        self.webrtc.connect("notify::connection-state", self.on_connection_state)
        self.webrtc.connect("notify::ice-gathering-state", self.on_gathering_state)
        self.direction = direction
        self.offer_sdp: str | None = None

    # --- negotiation ----------------------------------------------------------------

    def on_negotiation_needed(self, webrtc: Gst.Element) -> None:
        for index in range(8):
            transceiver = webrtc.emit("get-transceiver", index)
            if transceiver is None:
                break
            transceiver.set_property("direction", self.direction)
        promise = Gst.Promise.new_with_change_func(self.on_offer_created, webrtc, None)
        webrtc.emit("create-offer", None, promise)

    def on_offer_created(self, promise: Gst.Promise, webrtc: Gst.Element, _: Any) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            self.fail(f"webrtcbin made no offer: {reply.to_string() if reply else 'no reply'}")
            return
        webrtc.emit("set-local-description", offer, Gst.Promise.new())
        self.offer_sdp = offer.sdp.as_text()
        if self.opts.mode == "whip":
            threading.Thread(target=self.post_whip, daemon=True).start()

    def on_gathering_state(self, webrtc: Gst.Element, _: Any) -> None:
        state = webrtc.get_property("ice-gathering-state")
        if state == GstWebRTC.WebRTCICEGatheringState.COMPLETE and self.opts.mode == "offer":
            sdp = webrtc.get_property("local-description").sdp.as_text()
            threading.Thread(target=self.post_offer, args=(sdp,), daemon=True).start()

    def post_whip(self) -> None:
        assert self.offer_sdp is not None
        url = f"{self.opts.url}/whip/{self.opts.engine}"
        status, headers, body = http(
            "POST", url, self.offer_sdp.encode(), **{"Content-Type": "application/sdp"}
        )
        self.report["post_status"] = status
        if status != 201:
            self.fail(f"WHIP POST answered {status}: {body}")
            return
        self.resource = headers["Location"]
        self.etag = headers["ETag"]
        self.session_id = self.resource.rsplit("/", 1)[-1]
        self.set_answer(body)
        with self.lock:
            self.posted.set()
            pending, self.pending_candidates = self.pending_candidates, []
        for mline, candidate in pending:
            self.patch_candidate(mline, candidate)

    def post_offer(self, sdp: str) -> None:
        payload = json.dumps({"sdp": sdp, "type": "offer", "engine": self.opts.engine})
        status, _, body = http(
            "POST",
            f"{self.opts.url}/offer",
            payload.encode(),
            **{"Content-Type": "application/json"},
        )
        self.report["post_status"] = status
        if status != 200:
            self.fail(f"POST /offer answered {status}: {body}")
            return
        answer = json.loads(body)
        self.session_id = answer["session_id"]
        self.resource = f"/sessions/{self.session_id}"
        self.set_answer(answer["sdp"])

    def set_answer(self, sdp: str) -> None:
        self.report["answer_candidates"] = sdp.count("a=candidate:")
        _, message = GstSdp.SDPMessage.new_from_text(sdp)
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, message)
        self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())

    # --- trickle ICE (WHIP) -------------------------------------------------------------

    def on_ice_candidate(self, _: Gst.Element, mline: int, candidate: str) -> None:
        self.report.setdefault("local_candidates", []).append(candidate)
        if self.opts.mode != "whip":
            return
        with self.lock:
            if not self.posted.is_set():
                self.pending_candidates.append((mline, candidate))
                return
        threading.Thread(target=self.patch_candidate, args=(mline, candidate), daemon=True).start()

    def patch_candidate(self, mline: int, candidate: str) -> None:
        assert self.resource is not None and self.offer_sdp is not None
        mid = "audio0"
        for line in self.offer_sdp.splitlines():
            if line.startswith("a=mid:"):
                mid = line[len("a=mid:") :]
                break
        fragment = f"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:{mid}\r\na={candidate}\r\n"
        status, _, body = http(
            "PATCH",
            self.opts.url + self.resource,
            fragment.encode(),
            **{"Content-Type": "application/trickle-ice-sdpfrag", "If-Match": self.etag},
        )
        self.report.setdefault("patch_statuses", []).append(status)
        if status != 204:
            self.report.setdefault("patch_errors", []).append(f"{status} {body}")

    # --- media and state --------------------------------------------------------------

    def on_pad_added(self, _: Gst.Element, pad: Gst.Pad) -> None:
        if pad.get_direction() != Gst.PadDirection.SRC or not self.opts.receive:
            return
        chain = Gst.parse_bin_from_description(RECEIVE_CHAIN.format(path=self.opts.receive), True)
        self.pipeline.add(chain)
        chain.sync_state_with_parent()
        pad.link(chain.get_static_pad("sink"))
        self.report["received_track"] = True

    def on_connection_state(self, webrtc: Gst.Element, _: Any) -> None:
        state = webrtc.get_property("connection-state").value_nick
        self.report["states"].append(state)
        if state == "connected":
            self.report["connected_after_s"] = round(time.monotonic() - self.started, 3)
            GLib.timeout_add(int(self.opts.seconds * 1000), self.finish)
        elif state == "failed":
            self.fail("the peer connection failed")

    def fail(self, why: str) -> None:
        self.report.setdefault("errors", []).append(why)
        GLib.idle_add(self.loop.quit)

    def finish(self) -> bool:
        if self.session_id is not None:
            status, _, body = http("GET", f"{self.opts.url}/sessions/{self.session_id}")
            self.report["server"] = json.loads(body) if status == 200 else {"status": status}
        self.loop.quit()
        return False

    def on_bus_message(self, _: Gst.Bus, message: Gst.Message) -> None:
        if message.type == Gst.MessageType.ERROR:
            error, debug = message.parse_error()
            self.fail(f"{error.message} ({debug})")

    def run(self) -> dict[str, Any]:
        bus = self.pipeline.get_bus()
        bus.add_signal_watch()
        bus.connect("message", self.on_bus_message)
        self.started = time.monotonic()
        GLib.timeout_add(int(self.opts.timeout * 1000), self.on_timeout)
        self.pipeline.set_state(Gst.State.PLAYING)
        self.loop.run()
        if self.resource is not None:
            status, _, _ = http("DELETE", self.opts.url + self.resource)
            self.report["delete_status"] = status
        self.pipeline.set_state(Gst.State.NULL)
        self.report["session_id"] = self.session_id
        return self.report

    def on_timeout(self) -> bool:
        self.fail(f"not done within {self.opts.timeout:g} s")
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--mode", choices=("whip", "offer"), required=True)
    parser.add_argument("--engine", default="echo")
    parser.add_argument("--send", required=True, help="raw s16le 48 kHz mono audio to send")
    parser.add_argument("--receive", help="where to write what comes back (offer mode)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to stay connected")
    parser.add_argument("--timeout", type=float, default=30.0)
    opts = parser.parse_args()
    Gst.init(None)
    report = Client(opts).run()
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
