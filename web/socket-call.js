// One call over the server's WebSocket transport (GET /ws, see the README's "WebSocket
// protocol"): the microphone goes out as 48 kHz PCM16 frames, the engine's frames come back
// into a jitter buffer and are acknowledged as they play, and the same socket carries the
// control messages and the server's events. It offers the page what Call (call.js) offers,
// with the same handlers, except that a dropped socket ends the call instead of resuming it.

import { accessToken, api } from "./api.js";
import { CallClosed, parseMessage } from "./call.js";
import { callMicrophone } from "./microphone.js";
import { FRAME_SAMPLES, SAMPLE_RATE, SocketAudio } from "./socket-audio.js";
import { packFrame, unpackFrame } from "./socket-frames.js";
import { SocketStats } from "./socket-stats.js";

const SUBPROTOCOL = "cosyrtc";
// What the page can hold: the server never has more than this sent and not yet played.
const CREDIT_MS = 1000;
const ACK_EVERY_FRAMES = 3; // one acknowledgement per 60 ms played
const CLOSE_NORMAL = 1000; // a hang-up: the server ends the session
// Browsers cannot put a header on a WebSocket: the token travels as a second subprotocol
// entry, which the server reads as the bearer token (and never echoes back).
const TOKEN_SUBPROTOCOL = "cosyrtc.bearer.";

export class SocketCall {
  #closed = false;
  #ready = false;
  #ended = false; // the session is over: the server said so, or the page deleted it
  #refusal = null; // the server's error before ready, said again when it closes
  #sentSeq = 0;
  #unacked = 0;
  #stats = new SocketStats();

  // request: {engine, kind, options}. handlers: as Call's; onReconnecting and onSessionLost
  // are never called. None is called after close().
  constructor(request, handlers) {
    this.request = request;
    this.handlers = handlers;
    this.stream = null;
    this.ws = null;
    this.sessionId = null;
    this.audio = null;
  }

  // Resolves once the server is ready: audio flows both ways from then on.
  async connect() {
    this.audio = new SocketAudio();
    this.stream = await callMicrophone(this.request.kind, (...args) => this.#notify(...args));
    this.#ensureOpen();
    const track = this.stream?.getAudioTracks()[0];
    track?.addEventListener("ended", () => this.#notify("onMicrophoneEnded"));
    await this.audio.start(this.stream, {
      onFrame: (samples) => this.#sendFrame(samples),
      onPlayed: (seq, bufferedFrames) => this.#played(seq, bufferedFrames),
    });
    this.#ensureOpen();
    this.#notify("onTrack", this.audio.stream);
    await this.#open();
  }

  // Sends one control message; false when the socket is not ready (yet, or any more).
  send(message) {
    if (!this.#ready || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    return true;
  }

  browserStats() {
    return this.#stats;
  }

  // Safe to call more than once, at any step of connect(). Closing the socket normally is
  // the hang-up that ends the session; a socket that dropped left the session waiting for a
  // resume that will not come, so it is deleted instead.
  close() {
    this.#closed = true;
    if (this.#ready && !this.#ended && this.ws.readyState === WebSocket.CLOSED) {
      this.#ended = true;
      // keepalive lets the request finish even when the page is being closed.
      const url = `/sessions/${encodeURIComponent(this.sessionId)}`;
      api(url, { method: "DELETE", keepalive: true }).catch(() => {});
    }
    this.ws?.close(CLOSE_NORMAL);
    this.audio?.close();
    this.stream?.getTracks().forEach((track) => track.stop());
  }

  #ensureOpen() {
    if (!this.#closed) return;
    // Whatever the step before this one acquired arrived after close(): release it too.
    this.close();
    throw new CallClosed("call closed");
  }

  // The socket, its hello, and the server's ready (or its refusal, thrown).
  #open() {
    return new Promise((resolve, reject) => {
      const url = new URL("/ws", location.href);
      url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
      const token = accessToken();
      const ws = new WebSocket(url, token ? [SUBPROTOCOL, TOKEN_SUBPROTOCOL + token] : SUBPROTOCOL);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      ws.addEventListener("open", () => ws.send(JSON.stringify(this.#hello())));
      ws.addEventListener("message", ({ data }) => {
        if (typeof data !== "string") this.#receiveFrame(data);
        else if (this.#onText(parseMessage(data))) resolve();
      });
      ws.addEventListener("close", (event) => {
        if (this.#ready) this.#onClose(event.code);
        else reject(new Error(this.#refusal ?? "Could not reach the server. Press Start again."));
      });
    });
  }

  #hello() {
    const { engine, options } = this.request;
    const codec = { name: "pcm16", rate: SAMPLE_RATE };
    return { type: "hello", engine, options, codec, credit_ms: CREDIT_MS };
  }

  // true when the message was the server's ready.
  #onText(message) {
    switch (message.type) {
      case "ready":
        this.sessionId = message.session_id;
        this.#ready = true;
        this.#notify("onChannelOpen");
        this.#notify("onState", "connected");
        return true;
      case "clear":
        this.audio.clear();
        this.#stats.cleared();
        return false;
      case "error":
        if (this.#ready) break;
        this.#refusal = message.message; // the close that follows rejects connect() with it
        return false;
      case "session_ended":
        this.#ended = true;
        break;
    }
    this.#notify("onMessage", message);
    return false;
  }

  #onClose(code) {
    if (this.#ended || code === CLOSE_NORMAL) {
      this.#ended = true;
      this.#notify("onServerClosed");
    } else {
      this.#notify("onLost", "The connection to the server was lost. Press Start to call again.");
    }
  }

  #sendFrame(samples) {
    if (!this.#ready || this.ws.readyState !== WebSocket.OPEN) return;
    const message = packFrame(this.#sentSeq, this.#sentSeq * FRAME_SAMPLES, samples);
    this.#sentSeq += 1;
    this.ws.send(message);
    this.#stats.sent(message.byteLength);
  }

  #receiveFrame(buffer) {
    const frame = unpackFrame(buffer);
    this.#stats.received(buffer.byteLength, frame.seq, frame.timestamp, performance.now());
    this.audio.play(frame);
  }

  // Acknowledges every few frames played: the server sends on while the page keeps up.
  #played(seq, bufferedFrames) {
    this.#stats.played(bufferedFrames);
    this.#unacked += 1;
    if (this.#unacked < ACK_EVERY_FRAMES) return;
    this.#unacked = 0;
    this.send({ type: "ack", seq });
  }

  #notify(name, ...args) {
    if (!this.#closed) this.handlers[name](...args);
  }
}
