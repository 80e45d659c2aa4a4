// The WebSocket transport's audio message, both ways: an 8-byte header (uint32 seq, uint32
// timestamp in samples, big-endian) and 16-bit little-endian PCM, mono. From the server an
// empty payload is a frame of silence.

const HEADER_BYTES = 8;

// samples: Float32Array in [-1, 1]; returns the message's bytes.
export function packFrame(seq, timestamp, samples) {
  const view = new DataView(new ArrayBuffer(HEADER_BYTES + samples.length * 2));
  view.setUint32(0, seq >>> 0);
  view.setUint32(4, timestamp >>> 0);
  samples.forEach((sample, i) => {
    const clipped = Math.max(-1, Math.min(1, sample));
    view.setInt16(HEADER_BYTES + i * 2, Math.round(clipped * 32767), true);
  });
  return view.buffer;
}

// buffer: an ArrayBuffer from the socket; samples is null for silence.
export function unpackFrame(buffer) {
  const view = new DataView(buffer);
  const count = (buffer.byteLength - HEADER_BYTES) >> 1;
  let samples = null;
  if (count > 0) {
    samples = new Float32Array(count);
    for (let i = 0; i < count; i++) samples[i] = view.getInt16(HEADER_BYTES + i * 2, true) / 32768;
  }
  return { seq: view.getUint32(0), timestamp: view.getUint32(4), samples };
}
