// One call over the server's WebSocket transport (GET /ws, see the README's "WebSocket
// protocol"): the microphone goes out as 48 kHz PCM16 frames, the engine's frames come back
// into a jitter buffer and are acknowledged as they play, and the same socket carries the
// control messages and the server's events. It offers the page what Call (call.js) offers,
// with the same handlers: when the socket drops, the call resumes its server session on a
// new socket (see #resume), while the microphone and the audio go on.

import { accessToken, api } from "./api.js";
// The resume's pauses and the limit on each attempt are Call's: 15 s in all, inside the
// server's default 20 s grace period.
import {
  CallClosed,
  parseMessage,
  RESUME_DELAYS_MS,
  RESUME_STEP_TIMEOUT_MS,
  sleep,
} from "./call.js";
import { callMicrophone } from "./microphone.js";
import { FRAME_SAMPLES, SAMPLE_RATE, SocketAudio } from "./socket-audio.js";
import { packFrame, unpackFrame } from "./socket-frames.js";
import { SocketStats } from "./socket-stats.js";

const SUBPROTOCOL = "cosyrtc";
// What the page can hold: the server never has more than this sent and not yet played.
const CREDIT_MS = 1000;
const ACK_EVERY_FRAMES = 3; // one acknowledgement per 60 ms played
const CLOSE_NORMAL = 1000; // a hang-up: the server ends the session
// A socket the page gives up on: any code but 1000 leaves the session resumable.
const CLOSE_ABANDONED = 4000;
// Browsers cannot put a header on a WebSocket: the token travels as a second subprotocol
// entry, which the server reads as the bearer token (and never echoes back).
const TOKEN_SUBPROTOCOL = "cosyrtc.bearer.";
// The server sends a frame every 20 ms and its stats every second. A socket that has carried
// nothing for this long is dead, though the browser may not notice for minutes (a network
// that vanished without a word): it is replaced, as Call replaces a link ICE calls
// "disconnected".
const QUIET_LIMIT_MS = 5000;
const QUIET_CHECK_MS = 1000;

// The server refused a hello: status is its close code less 4000, code its error's "error".
class SocketRefused extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class SocketCall {
  #closed = false;
  #ready = false; // the socket in use has had its ready: audio and messages flow
  #ended = false; // the session is over: the server said so, or the page deleted it
  #resumeToken = null;
  #resuming = false;
  // Why the last socket was lost: "released" when the server closed it (it let go of the
  // socket), "failed" when it dropped without a close (the network, or the server's machine).
  #lostHow = null;
  #playedSeq = null; // the last frame played, told to the server on a resume
  #newestSeq = null; // the newest frame received
  #heardAt = 0; // when the socket in use last carried anything (performance.now())
  #quietTimer = 0;
  #sentSeq = 0;
  #unacked = 0;
  #stats = new SocketStats();

  // request: {engine, kind, options}. handlers: as Call's (call.js), onTrack called once:
  // the stream played stays the same across a resume. None is called after close().
  constructor(request, handlers) {
    this.request = request;
    this.handlers = handlers;
    this.stream = null;
    this.ws = null; // the socket in use, or the one being opened during a resume
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

  // Safe to call more than once, at any step of connect() and of a resume. The session ends
  // with the call: closing a ready socket normally is the hang-up that ends it; without one
  // (it dropped, a resume is under way) the session would wait for a resume that will not
  // come, so it is deleted.
  close() {
    this.#closed = true;
    clearInterval(this.#quietTimer);
    if (this.sessionId && !this.#ended) {
      this.#ended = true;
      if (!this.#ready || this.ws.readyState !== WebSocket.OPEN) {
        // keepalive lets the request finish even when the page is being closed.
        const url = `/sessions/${encodeURIComponent(this.sessionId)}`;
        api(url, { method: "DELETE", keepalive: true }).catch(() => {});
      }
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

  // A new socket, its hello (resume: {session_id, token, played_seq} to continue the session)
  // and the server's ready. Rejects with the server's refusal (SocketRefused), or an Error
  // when the socket closes or, given timeoutMs, takes longer than that to be ready. Its
  // events count only while it is the call's socket.
  #open(resume = null, timeoutMs = 0) {
    return new Promise((resolve, reject) => {
      const url = new URL("/ws", location.href);
      url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
      const token = accessToken();
      const ws = new WebSocket(url, token ? [SUBPROTOCOL, TOKEN_SUBPROTOCOL + token] : SUBPROTOCOL);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      const current = () => ws === this.ws;
      let refusal = null; // the server's error before ready, said again when it closes
      let timer = 0;
      if (timeoutMs > 0) {
        timer = setTimeout(() => {
          ws.close(CLOSE_ABANDONED);
          reject(new Error("The server did not answer in time."));
        }, timeoutMs);
      }
      ws.addEventListener("open", () => ws.send(JSON.stringify(this.#hello(resume))));
      ws.addEventListener("message", ({ data }) => {
        if (!current()) return;
        this.#heardAt = performance.now();
        if (typeof data !== "string") {
          if (this.#ready) this.#receiveFrame(data);
          return;
        }
        const message = parseMessage(data);
        if (this.#ready) {
          this.#onText(message);
        } else if (message.type === "ready") {
          clearTimeout(timer);
          this.#onReady(message);
          resolve();
        } else if (message.type === "error") {
          refusal = message;
        }
      });
      ws.addEventListener("close", (event) => {
        clearTimeout(timer);
        if (!current()) return;
        if (this.#ready) {
          this.#connectionLost(event.code === CLOSE_NORMAL, event.wasClean);
          return;
        }
        const status = event.code - 4000;
        if (refusal && status >= 400 && status < 600) {
          reject(new SocketRefused(status, refusal.error, refusal.message));
        } else {
          reject(new Error(refusal?.message ?? "Could not reach the server. Press Start again."));
        }
      });
    });
  }

  #hello(resume) {
    const { engine, options } = this.request;
    const codec = { name: "pcm16", rate: SAMPLE_RATE };
    const hello = { type: "hello", engine, options, codec, credit_ms: CREDIT_MS };
    return resume ? { ...hello, resume } : hello;
  }

  #onReady(message) {
    this.sessionId = message.session_id;
    this.#resumeToken = message.resume_token; // each ready carries the next (single use)
    this.#ready = true;
    clearInterval(this.#quietTimer);
    this.#quietTimer = setInterval(() => this.#checkQuiet(), QUIET_CHECK_MS);
    this.#notify("onChannelOpen");
    this.#notify("onState", "connected");
  }

  #onText(message) {
    switch (message.type) {
      case "clear":
        this.audio.clear();
        this.#stats.cleared();
        return;
      case "session_ended":
        this.#ended = true;
        break;
    }
    this.#notify("onMessage", message);
  }

  #checkQuiet() {
    if (!this.#ready || performance.now() - this.#heardAt < QUIET_LIMIT_MS) return;
    // Closed with a code that keeps the session, though the server will likely never hear
    // it; its close event, whenever the browser reports it, is no longer the call's.
    const ws = this.ws;
    this.ws = null;
    ws.close(CLOSE_ABANDONED);
    this.#connectionLost(false, false);
  }

  // The socket in use is gone. A normal close, or any after session_ended, is the end of the
  // session; any other close is resumed, on a new socket.
  #connectionLost(normal, clean) {
    this.#ready = false;
    clearInterval(this.#quietTimer);
    if (this.#closed || this.#resuming) return;
    if (this.#ended || normal) {
      this.#ended = true;
      this.#notify("onServerClosed");
      return;
    }
    this.#lostHow = clean ? "released" : "failed";
    this.#resume();
  }

  // One resume at a time, a few attempts with growing pauses; each refusal is final. The
  // same steps and the same words as Call's.
  async #resume() {
    this.#resuming = true;
    try {
      for (const [index, delay] of RESUME_DELAYS_MS.entries()) {
        await sleep(delay);
        this.#ensureOpen();
        this.#notify("onReconnecting", index + 1);
        if (await this.#tryResume()) return;
      }
      const message = "The connection to the server could not be restored.";
      this.#notify("onLost", `${message} Press Start to call again.`);
    } catch (err) {
      if (err instanceof CallClosed) return;
      if (err.code === "session_not_found") {
        this.#ended = true;
        this.#notify(this.#lostHow === "released" ? "onServerClosed" : "onSessionLost");
      } else {
        this.#notify("onLost", `The call could not be resumed: ${err.message}`);
      }
    } finally {
      this.#resuming = false;
    }
  }

  // true once the new socket is ready, false when another attempt may do better; throws a
  // refusal (asking again gets the same answer) and CallClosed.
  async #tryResume() {
    const resume = {
      session_id: this.sessionId,
      token: this.#resumeToken,
      played_seq: this.#playedSeq,
    };
    try {
      await this.#open(resume, RESUME_STEP_TIMEOUT_MS);
      return true;
    } catch (err) {
      this.#ensureOpen();
      if (isFinalRefusal(err)) throw err;
      return false;
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
    // After a resume the server sends again what was never acknowledged, and the page may
    // hold some of it already: only frames newer than any received are kept.
    if (this.#newestSeq !== null && !isNewer(frame.seq, this.#newestSeq)) return;
    this.#newestSeq = frame.seq;
    this.#stats.received(buffer.byteLength, frame.seq, frame.timestamp, performance.now());
    this.audio.play(frame);
  }

  // Acknowledges every few frames played: the server sends on while the page keeps up.
  #played(seq, bufferedFrames) {
    this.#playedSeq = seq;
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

// 4xx but 429 (rate limited): the server has said no, not "not now". A 403 is the resume
// token's (invalid_resume_token) or the access token's: neither gets better by asking again.
function isFinalRefusal(err) {
  return err instanceof SocketRefused && err.status < 500 && err.status !== 429;
}

// Sequence numbers are uint32 and wrap: a is newer than b when it is less than half the
// range ahead of it.
function isNewer(a, b) {
  const ahead = (a - b) >>> 0;
  return ahead > 0 && ahead < 2 ** 31;
}
