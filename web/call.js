// One WebRTC call to the server: the microphone goes out, the engine's audio comes back, and
// a data channel carries control messages and the server's events. When the network drops,
// the call resumes its server session on a new connection (see #resume).

import { api, AuthError, isAuthFailure } from "./api.js";
import { callMicrophone } from "./microphone.js";
import { BrowserStats } from "./stats.js";

// The server does not take trickled candidates, so the offer waits for gathering to finish.
// Some browsers never report "complete" on odd networks; after this long, send what we have.
const ICE_GATHERING_TIMEOUT_MS = 5000;
// "disconnected" often heals by itself (a short Wi-Fi hiccup); a link still down after this
// long is replaced.
const DISCONNECTED_WAIT_MS = 2000;
// The pause before each resume attempt: 15 s in all, inside the server's default 20 s grace
// period (after it the server answers 404 and the page starts a new call).
export const RESUME_DELAYS_MS = [0, 1000, 2000, 4000, 8000];
// An attempt whose offer or new connection takes longer than this has failed: on a dead
// network a request can hang for minutes.
export const RESUME_STEP_TIMEOUT_MS = 5000;
// Thrown by a call's pending steps once it has been closed: not a failure to report.
export class CallClosed extends Error {}

// The server answered an offer with an error; code is its "error" field.
class OfferRefused extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Call {
  #closed = false;
  #sessionDeleted = false;
  #resumeToken = null;
  #connectedOnce = false;
  #resuming = false;
  // Why the last connection was lost: "released" when the server closed the data channel
  // while the connection was up (it ended the session or let go of this connection),
  // "failed" when the connection itself died (the network, or the server's machine).
  #lostHow = null;
  #ended = false;
  #disconnectTimer = 0;
  // A connection being replaced: kept open until the server has taken its successor.
  #retired = null;

  // request: {engine, kind, options}. handlers: onMicrophone(stream), onMicrophoneMissing(err),
  // onTrack(stream), onState(connectionState), onChannelOpen(), onMessage(object),
  // onReconnecting(attempt), onServerClosed(), onSessionLost(), onLost(message),
  // onMicrophoneEnded(). onSessionLost: the session vanished with its server (a resume was
  // refused after the connection died), so a new call is the way on. None is called after
  // close().
  constructor(request, handlers) {
    this.request = request;
    this.handlers = handlers;
    this.stream = null;
    this.pc = null; // the connection in use; null between two during a resume
    this.channel = null;
    this.sessionId = null;
  }

  // Resolves once the answer is applied; media connects shortly after (see onState).
  async connect() {
    this.stream = await callMicrophone(this.request.kind, (...args) => this.#notify(...args));
    this.#ensureOpen();
    const track = this.stream?.getAudioTracks()[0];
    track?.addEventListener("ended", () => this.#notify("onMicrophoneEnded"));
    const link = this.#createPeerConnection();
    this.#use(link);
    await link.pc.setRemoteDescription(await this.#offer(link.pc));
  }

  // Sends one control message; false when the channel is not open (yet, or any more).
  send(message) {
    if (this.channel?.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }

  // The browser's figures for the connection in use now.
  browserStats() {
    return new BrowserStats(this.pc);
  }

  // Safe to call more than once, at any step of connect() and of a resume.
  close() {
    this.#closed = true;
    this.#release();
  }

  #ensureOpen() {
    if (!this.#closed) return;
    // Whatever the step before this one acquired arrived after close(): release it too.
    this.#release();
    throw new CallClosed("call closed");
  }

  #release() {
    if (this.sessionId && !this.#sessionDeleted) {
      this.#sessionDeleted = true;
      // keepalive lets the request finish even when the page is being closed.
      const url = `/sessions/${encodeURIComponent(this.sessionId)}`;
      api(url, { method: "DELETE", keepalive: true }).catch(() => {});
    }
    clearTimeout(this.#disconnectTimer);
    this.pc?.close();
    this.#retired?.close();
    this.stream?.getTracks().forEach((track) => track.stop());
  }

  // A connection with its data channel. Its events count only while it is the call's
  // connection: one being replaced reports nothing.
  #createPeerConnection() {
    const pc = new RTCPeerConnection({ iceServers: [] });
    const current = () => pc === this.pc;
    const track = this.stream?.getAudioTracks()[0];
    if (track) {
      pc.addTransceiver(track, { direction: "sendrecv", streams: [this.stream] });
    } else {
      pc.addTransceiver("audio", { direction: "recvonly" });
    }
    pc.addEventListener("track", (event) => {
      if (current()) this.#notify("onTrack", event.streams[0] ?? new MediaStream([event.track]));
    });
    pc.addEventListener("connectionstatechange", () => {
      if (current()) this.#onState(pc);
    });
    // The server adopts the first data channel a peer opens, whatever its label.
    const channel = pc.createDataChannel("control");
    channel.addEventListener("open", () => {
      if (current()) this.#notify("onChannelOpen");
    });
    // The server closes the channel when it ends the session and when it lets go of this
    // connection (the caller's media stopped), seconds before ICE notices. Only a resume can
    // tell which: the server answers 404 to a session that has ended.
    channel.addEventListener("close", () => {
      const how = pc.connectionState === "connected" ? "released" : "failed";
      if (current()) this.#connectionLost(how);
    });
    channel.addEventListener("message", (event) => {
      if (current()) this.#onMessage(parseMessage(event.data));
    });
    return { pc, channel };
  }

  #use(link) {
    this.pc = link.pc;
    this.channel = link.channel;
  }

  // Sends pc's offer (with the resume field when given) and returns the answer to apply.
  async #offer(pc, resume, signal) {
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc);
    this.#ensureOpen();
    const answer = await postOffer(pc.localDescription.sdp, this.request, resume, signal);
    // Recorded before the check so that a call closed meanwhile still deletes its session.
    this.sessionId = answer.session_id;
    this.#resumeToken = answer.resume_token;
    this.#ensureOpen();
    return { type: "answer", sdp: answer.sdp };
  }

  #onState(pc) {
    const state = pc.connectionState;
    this.#notify("onState", state);
    clearTimeout(this.#disconnectTimer);
    if (state === "connected") {
      this.#connectedOnce = true;
    } else if (state === "failed") {
      this.#connectionLost("failed");
    } else if (state === "disconnected") {
      const lost = () => this.#connectionLost("failed");
      this.#disconnectTimer = setTimeout(lost, DISCONNECTED_WAIT_MS);
    }
  }

  // session_ended is the server's last word: whatever closes next, there is nothing to resume.
  #onMessage(message) {
    if (message.type === "session_ended") this.#ended = true;
    this.#notify("onMessage", message);
  }

  // The connection is gone. A call that has been connected resumes its session on a new one;
  // one that never connected has nothing to resume.
  #connectionLost(how) {
    if (this.#closed || this.#resuming) return;
    this.#lostHow = how;
    if (this.#ended) {
      this.#sessionDeleted = true;
      this.#notify("onServerClosed");
    } else if (this.#connectedOnce) {
      this.#resume();
    } else {
      this.#notify("onLost", "The connection to the server failed. Press Start to try again.");
    }
  }

  // One resume at a time, a few attempts with growing pauses; each refusal is final.
  async #resume() {
    this.#resuming = true;
    try {
      for (const [index, delay] of RESUME_DELAYS_MS.entries()) {
        await sleep(delay);
        this.#ensureOpen();
        this.#retire();
        this.#notify("onReconnecting", index + 1);
        if (await this.#tryResume()) return;
      }
      const message = "The connection to the server could not be restored.";
      this.#notify("onLost", `${message} Press Start to call again.`);
    } catch (err) {
      if (err instanceof CallClosed) return;
      if (err.code === "session_not_found") {
        this.#sessionDeleted = true;
        this.#notify(this.#lostHow === "released" ? "onServerClosed" : "onSessionLost");
      } else {
        this.#notify("onLost", `The call could not be resumed: ${err.message}`);
      }
    } finally {
      this.#resuming = false;
    }
  }

  // Stops using the connection without closing it: closing it would tell the server, if it
  // can still hear us, that the caller hung up, and it would end the session.
  #retire() {
    if (!this.pc) return;
    clearTimeout(this.#disconnectTimer);
    this.#retired = this.pc;
    this.pc = this.channel = null;
  }

  // true once the new connection is up, false when another attempt may do better; throws a
  // refusal (asking again gets the same answer) and CallClosed.
  async #tryResume() {
    const link = this.#createPeerConnection();
    try {
      const resume = { session_id: this.sessionId, token: this.#resumeToken };
      const signal = AbortSignal.timeout(RESUME_STEP_TIMEOUT_MS);
      const answer = await this.#offer(link.pc, resume, signal);
      // The server has let go of the old connection for this one.
      this.#retired?.close();
      this.#retired = null;
      this.#use(link);
      await link.pc.setRemoteDescription(answer);
      await connected(link.pc, RESUME_STEP_TIMEOUT_MS);
      return true;
    } catch (err) {
      if (link.pc !== this.pc) link.pc.close();
      if (err instanceof CallClosed || isFinalRefusal(err)) throw err;
      return false;
    }
  }

  #notify(name, ...args) {
    if (!this.#closed) this.handlers[name](...args);
  }
}

// 4xx but 429 (rate limited): the server has said no, not "not now". A 403 is the resume
// token's (invalid_resume_token) or the access token's: neither gets better by asking again.
function isFinalRefusal(err) {
  const refused = err instanceof OfferRefused || err instanceof AuthError;
  return refused && err.status < 500 && err.status !== 429;
}

export function parseMessage(data) {
  try {
    return JSON.parse(data);
  } catch {
    return { type: "error", error: "not_json", message: String(data) };
  }
}

function iceGatheringComplete(pc) {
  return new Promise((resolve) => {
    const check = () => pc.iceGatheringState === "complete" && resolve();
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, ICE_GATHERING_TIMEOUT_MS);
    check();
  });
}

// resume: {session_id, token} to continue a session on this offer's connection.
async function postOffer(sdp, { engine, options }, resume, signal) {
  const response = await api("/offer", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sdp, type: "offer", engine, options, resume }),
    signal,
  }).catch(() => {
    throw new Error("Could not reach the server. Check that it is running and press Start again.");
  });
  const body = await response.json().catch(() => null);
  const refusal = body?.message ?? `The server refused the call (HTTP ${response.status}).`;
  if (isAuthFailure(response.status)) throw new AuthError(response.status, refusal);
  if (!response.ok) throw new OfferRefused(response.status, body?.error, refusal);
  if (typeof body?.sdp !== "string") throw new Error("The server's answer could not be read.");
  return body;
}

// Resolves when pc connects; rejects when it fails or takes longer than timeoutMs.
function connected(pc, timeoutMs) {
  return new Promise((resolve, reject) => {
    const check = () => {
      if (pc.connectionState === "connected") resolve();
      if (pc.connectionState === "failed") reject(new Error("the new connection failed"));
    };
    pc.addEventListener("connectionstatechange", check);
    setTimeout(() => reject(new Error("the new connection did not connect")), timeoutMs);
    check();
  });
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
