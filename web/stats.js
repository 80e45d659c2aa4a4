// The browser's side of the call from RTCPeerConnection.getStats(): its jitter buffer, the
// jitter and loss it sees on the server's stream, bitrates both ways and the round trip.

export class BrowserStats {
  #previous = null;

  constructor(pc) {
    this.pc = pc;
  }

  // Counters are cumulative, so rates and the jitter buffer delay are taken over the time
  // since the previous sample: they show the call now, not its average since it started.
  async sample() {
    const report = await this.pc.getStats();
    const { inbound, outbound, pair } = pickStats(report);
    const now = {
      time: performance.now(),
      bufferDelay: inbound?.jitterBufferDelay ?? 0,
      emitted: inbound?.jitterBufferEmittedCount ?? 0,
      bytesIn: inbound?.bytesReceived ?? 0,
      bytesOut: outbound?.bytesSent ?? 0,
    };
    const before = this.#previous;
    this.#previous = now;
    return {
      jitterBufferMs: jitterBufferMs(before, now),
      jitterMs: inbound?.jitter == null ? null : inbound.jitter * 1000,
      packetsLost: inbound?.packetsLost ?? null,
      bitrateInKbps: kbps(before, now, "bytesIn"),
      bitrateOutKbps: kbps(before, now, "bytesOut"),
      rttMs: pair?.currentRoundTripTime == null ? null : pair.currentRoundTripTime * 1000,
    };
  }
}

function pickStats(report) {
  const picked = {};
  for (const stats of report.values()) {
    if (stats.type === "inbound-rtp" && stats.kind === "audio") picked.inbound = stats;
    else if (stats.type === "outbound-rtp" && stats.kind === "audio") picked.outbound = stats;
    else if (stats.type === "transport") picked.pair = report.get(stats.selectedCandidatePairId);
  }
  return picked;
}

// Seconds of buffering summed over every emitted sample, divided by their count: the mean time
// a sample waited in the buffer. Before a second sample exists, the call's mean so far.
function jitterBufferMs(before, now) {
  const emitted = now.emitted - (before?.emitted ?? 0);
  if (emitted <= 0) return null;
  return ((now.bufferDelay - (before?.bufferDelay ?? 0)) / emitted) * 1000;
}

function kbps(before, now, key) {
  if (!before || now.time <= before.time) return null;
  return ((now[key] - before[key]) * 8) / (now.time - before.time);
}
