// One WebRTC call to the server: the microphone goes out, the engine's audio comes back, and
// a data channel carries control messages and the server's events.

import { api, AuthError, isAuthFailure } from "./api.js";

// Browser noise suppression stays off so that what you hear is the server's denoiser.
const MIC_CONSTRAINTS = {
  audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false },
};
// The server does not take trickled candidates, so the offer waits for gathering to finish.
// Some browsers never report "complete" on odd networks; after this long, send what we have.
const ICE_GATHERING_TIMEOUT_MS = 5000;
// What went wrong with getUserMedia, and what the person can do about it.
const MIC_PROBLEMS = {
  NotAllowedError: [
    "Microphone access was denied.",
    "Allow it in the browser's site settings and press Start again.",
  ],
  NotFoundError: ["No microphone was found.", "Connect one and press Start again."],
  NotReadableError: [
    "The microphone could not be started.",
    "Another application may be using it.",
  ],
  insecure: ["The microphone needs a secure page.", "Open this site over https or localhost."],
};

class MicrophoneError extends Error {
  constructor(name) {
    const [problem, fix] = MIC_PROBLEMS[name] ?? [
      `The microphone could not be opened (${name}).`,
      "Press Start to try again.",
    ];
    super(`${problem} ${fix}`);
    this.problem = problem;
  }
}

// Thrown by a call's pending steps once it has been closed: not a failure to report.
class CallClosed extends Error {}

export class Call {
  #closed = false;
  #sessionDeleted = false;

  // request: {engine, kind, options}. handlers: onMicrophone(stream), onMicrophoneMissing(err),
  // onTrack(stream), onState(connectionState), onChannelOpen(), onMessage(object),
  // onServerClosed(), onMicrophoneEnded(). None is called after close().
  constructor(request, handlers) {
    this.request = request;
    this.handlers = handlers;
    this.stream = null;
    this.pc = null;
    this.channel = null;
    this.sessionId = null;
  }

  // Resolves once the answer is applied; media connects shortly after (see onState).
  async connect() {
    this.stream = await this.#openMicrophone();
    this.#ensureOpen();
    this.pc = this.#createPeerConnection();
    await this.pc.setLocalDescription(await this.pc.createOffer());
    await iceGatheringComplete(this.pc);
    this.#ensureOpen();
    const answer = await postOffer(this.pc.localDescription.sdp, this.request);
    // Recorded before the check so that a call closed meanwhile still deletes its session.
    this.sessionId = answer.session_id;
    this.#ensureOpen();
    await this.pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  }

  // Sends one control message; false when the channel is not open (yet, or any more).
  send(message) {
    if (this.channel?.readyState !== "open") return false;
    this.channel.send(JSON.stringify(message));
    return true;
  }

  // Safe to call more than once, and at any step of connect().
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
    this.pc?.close();
    this.stream?.getTracks().forEach((track) => track.stop());
  }

  // A speak session still works without a microphone (only barge-in by voice is lost), so
  // there the failure is reported and the call goes on; a transform has nothing to process.
  async #openMicrophone() {
    try {
      const stream = await openMicrophone();
      this.#notify("onMicrophone", stream);
      return stream;
    } catch (err) {
      if (!(err instanceof MicrophoneError) || this.request.kind !== "speak") throw err;
      this.#notify("onMicrophoneMissing", err);
      return null;
    }
  }

  #createPeerConnection() {
    const pc = new RTCPeerConnection({ iceServers: [] });
    const track = this.stream?.getAudioTracks()[0];
    if (track) {
      pc.addTransceiver(track, { direction: "sendrecv", streams: [this.stream] });
      track.addEventListener("ended", () => this.#notify("onMicrophoneEnded"));
    } else {
      pc.addTransceiver("audio", { direction: "recvonly" });
    }
    pc.addEventListener("track", (event) => {
      this.#notify("onTrack", event.streams[0] ?? new MediaStream([event.track]));
    });
    pc.addEventListener("connectionstatechange", () => {
      this.#notify("onState", pc.connectionState);
    });
    // The server adopts the first data channel a peer opens, whatever its label.
    this.channel = pc.createDataChannel("control");
    this.channel.addEventListener("open", () => this.#notify("onChannelOpen"));
    // The server closes the channel only when it ends the session: that is seconds before
    // ICE notices, and there is no session left to delete.
    this.channel.addEventListener("close", () => {
      this.#sessionDeleted = true;
      this.#notify("onServerClosed");
    });
    this.channel.addEventListener("message", (event) => {
      this.#notify("onMessage", parseMessage(event.data));
    });
    return pc;
  }

  #notify(name, ...args) {
    if (!this.#closed) this.handlers[name](...args);
  }
}

async function openMicrophone() {
  // Outside https and localhost, browsers hide navigator.mediaDevices altogether.
  if (!navigator.mediaDevices?.getUserMedia) throw new MicrophoneError("insecure");
  try {
    return await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
  } catch (err) {
    throw new MicrophoneError(err.name);
  }
}

function parseMessage(data) {
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

async function postOffer(sdp, { engine, options }) {
  const response = await api("/offer", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sdp, type: "offer", engine, options }),
  }).catch(() => {
    throw new Error("Could not reach the server. Check that it is running and press Start again.");
  });
  const body = await response.json().catch(() => null);
  const refusal = body?.message ?? `The server refused the call (HTTP ${response.status}).`;
  if (isAuthFailure(response.status)) throw new AuthError(response.status, refusal);
  if (!response.ok) throw new Error(refusal);
  if (typeof body?.sdp !== "string") throw new Error("The server's answer could not be read.");
  return body;
}
