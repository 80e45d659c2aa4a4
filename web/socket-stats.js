// The browser's side of a WebSocket call, in the shape BrowserStats (stats.js) gives for a
// WebRTC one: the playout buffer, the jitter of the server's frames as they arrive, frames
// missing from their sequence, and bitrates both ways. A WebSocket has no round trip to read.

import { FRAME_MS, SAMPLE_RATE } from "./socket-audio.js";

export class SocketStats {
  #bytesIn = 0;
  #bytesOut = 0;
  #bufferedFramesSum = 0;
  #played = 0;
  #jitterMs = null;
  #lastTransitMs = null;
  #nextSeq = null;
  #missing = 0;
  #previous = null;

  // One audio message from the server, arrived at arrivalMs (performance.now()).
  received(bytes, seq, timestamp, arrivalMs) {
    this.#bytesIn += bytes;
    if (this.#nextSeq !== null) this.#missing += (seq - this.#nextSeq) >>> 0;
    this.#nextSeq = (seq + 1) >>> 0;
    // RFC 3550's interarrival jitter: how much the transit time varies, smoothed.
    const transitMs = arrivalMs - (timestamp * 1000) / SAMPLE_RATE;
    if (this.#lastTransitMs !== null) {
      const change = Math.abs(transitMs - this.#lastTransitMs);
      const jitter = this.#jitterMs ?? 0;
      this.#jitterMs = jitter + (change - jitter) / 16;
    }
    this.#lastTransitMs = transitMs;
  }

  // The server dropped what had not been played: the sequence skips on purpose.
  cleared() {
    this.#nextSeq = null;
  }

  sent(bytes) {
    this.#bytesOut += bytes;
  }

  // A frame played, with bufferedFrames waiting behind it.
  played(bufferedFrames) {
    this.#played += 1;
    this.#bufferedFramesSum += bufferedFrames;
  }

  // Rates and the buffer over the time since the previous sample, as BrowserStats does.
  async sample() {
    const now = {
      time: performance.now(),
      bytesIn: this.#bytesIn,
      bytesOut: this.#bytesOut,
      played: this.#played,
      bufferedFramesSum: this.#bufferedFramesSum,
    };
    const before = this.#previous ?? { time: now.time, played: 0, bufferedFramesSum: 0 };
    this.#previous = now;
    const played = now.played - before.played;
    const buffered = now.bufferedFramesSum - before.bufferedFramesSum;
    return {
      jitterBufferMs: played > 0 ? (buffered / played) * FRAME_MS : null,
      jitterMs: this.#jitterMs,
      packetsLost: this.#missing,
      bitrateInKbps: kbps(before, now, "bytesIn"),
      bitrateOutKbps: kbps(before, now, "bytesOut"),
      rttMs: null,
    };
  }
}

function kbps(before, now, key) {
  if (now.time <= before.time) return null;
  return ((now[key] - before[key]) * 8) / (now.time - before.time);
}
