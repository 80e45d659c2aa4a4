// AudioWorklet: plays the server's frames from a small jitter buffer.
//
// Frames arrive as {seq, samples} (samples null for `frameSamples` of silence). Playback
// starts, and starts again after running dry, once `targetFrames` are queued; beyond
// `maxFrames` the oldest are dropped, so a clock slower than the server's cannot build up
// delay. Each frame played is posted back as {played: seq, bufferedFrames}; the message
// "clear" drops everything not played yet.

class PlayoutProcessor extends AudioWorkletProcessor {
  constructor({ processorOptions }) {
    super();
    this.frameSamples = processorOptions.frameSamples;
    this.targetFrames = processorOptions.targetFrames;
    this.maxFrames = processorOptions.maxFrames;
    this.queue = [];
    this.current = null; // the frame being played
    this.offset = 0; // samples of it played so far
    this.waiting = true; // filling up to targetFrames before playing
    this.port.onmessage = ({ data }) => this.#receive(data);
  }

  #receive(data) {
    if (data === "clear") {
      this.queue = [];
      this.current = null;
      this.waiting = true;
      return;
    }
    this.queue.push(data);
    if (this.queue.length > this.maxFrames) this.queue.shift();
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let written = 0;
    while (written < out.length) {
      if (!this.current && !this.#next()) break; // the rest of this quantum stays silent
      const { samples } = this.current;
      const length = samples?.length ?? this.frameSamples;
      const count = Math.min(out.length - written, length - this.offset);
      if (samples) out.set(samples.subarray(this.offset, this.offset + count), written);
      written += count;
      this.offset += count;
      if (this.offset === length) {
        this.port.postMessage({ played: this.current.seq, bufferedFrames: this.queue.length });
        this.current = null;
      }
    }
    return true;
  }

  // Takes the next frame to play; false while filling or run dry.
  #next() {
    if (this.waiting && this.queue.length < this.targetFrames) return false;
    this.current = this.queue.shift() ?? null;
    this.offset = 0;
    this.waiting = this.current === null;
    return !this.waiting;
  }
}

registerProcessor("playout", PlayoutProcessor);
