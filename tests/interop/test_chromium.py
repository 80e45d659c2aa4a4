"""Chromium's own WebRTC stack over both signaling styles: JSON ``/offer`` and WHIP.

The page's tests (tests/browser) drive the page; these drive a bare ``RTCPeerConnection``
in Chromium, signalled as a third-party web app would, so both styles are covered with the
same checks as the GStreamer clients: the server counts the frames, and the tone the fake
microphone plays comes back (correlation, not energy). Loopback works for Chromium with
``--allow-loopback-in-peer-connection``, so no namespace is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from media.audio.wav import write_wav
from media.engines.registry import EngineRegistry
from tests.browser.test_page import CHROMIUM, chromium
from tests.conftest import running_server
from tests.interop.signals import RATE, stepped_tone, tone_match

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian's chromium is missing: `make test` installs it"
    ),
    pytest.mark.usefixtures("collected_first"),
]
CALL_SECONDS = 6.0  # Chromium settles its playout in the first second or so: a few windows more
TONE_SECONDS = 20.0
MIN_CORRELATION = 0.9

CALL_SCRIPT = """
async ({base, signaling, seconds}) => {
  const stream = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  const pc = new RTCPeerConnection();
  pc.addTransceiver(stream.getAudioTracks()[0], {direction: 'sendrecv', streams: [stream]});
  const remote = new Promise(resolve => { pc.ontrack = e => resolve(e.streams[0]); });
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(resolve => {
    if (pc.iceGatheringState === 'complete') return resolve();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && resolve();
  });
  let answer, sessionId;
  if (signaling === 'whip') {
    const response = await fetch(base + 'whip/echo', {method: 'POST',
      headers: {'Content-Type': 'application/sdp'}, body: pc.localDescription.sdp});
    if (response.status !== 201) throw new Error('WHIP answered ' + response.status);
    sessionId = response.headers.get('Location').split('/').pop();
    answer = await response.text();
  } else {
    const response = await fetch(base + 'offer', {method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({sdp: pc.localDescription.sdp, type: 'offer', engine: 'echo'})});
    if (response.status !== 200) throw new Error('/offer answered ' + response.status);
    const body = await response.json();
    sessionId = body.session_id;
    answer = body.sdp;
  }
  await pc.setRemoteDescription({type: 'answer', sdp: answer});
  const incoming = await remote;
  const element = new Audio();  // Chromium feeds Web Audio from a remote stream only if played
  element.srcObject = incoming;
  await element.play();
  const context = new AudioContext({sampleRate: 48000});
  const source = context.createMediaStreamSource(incoming);
  const recorder = context.createScriptProcessor(4096, 1, 1);
  const chunks = [];
  recorder.onaudioprocess = e => chunks.push(Array.from(e.inputBuffer.getChannelData(0)));
  source.connect(recorder);
  recorder.connect(context.destination);
  await new Promise(resolve => setTimeout(resolve, seconds * 1000));
  window.heldCall = {pc, context, stream};
  return {sessionId, state: pc.connectionState, samples: chunks.flat()};
}
"""


@pytest.fixture(scope="module")
def tone_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tone") / "tone.wav"
    write_wav(path, stepped_tone(TONE_SECONDS), RATE)
    return path


@pytest.mark.parametrize("signaling", ["offer", "whip"])
async def test_chromium_call_is_heard_by_the_server_and_its_tone_comes_back(
    registry: EngineRegistry, tone_wav: Path, signaling: str
) -> None:
    async with running_server(registry) as server, chromium(tone_wav) as browser:
        page = await browser.new_page()
        await page.goto(server.url)
        result: dict[str, Any] = await page.evaluate(
            CALL_SCRIPT, {"base": server.url, "signaling": signaling, "seconds": CALL_SECONDS}
        )
        session = server.server.sessions.get(result["sessionId"])
        frames = session.pipeline.receive_stats.frames
        async with aiohttp.ClientSession() as http:
            path = "whip/sessions" if signaling == "whip" else "sessions"
            async with http.delete(f"{server.url}{path}/{result['sessionId']}") as response:
                assert response.status == 200
    assert result["state"] == "connected"
    assert frames >= 0.8 * CALL_SECONDS * 50
    received = np.asarray(result["samples"], np.float32)
    assert len(received) >= 0.8 * CALL_SECONDS * RATE
    assert tone_match(stepped_tone(TONE_SECONDS), received) >= MIN_CORRELATION
