// AudioWorklet: the microphone cut into frames of `frameSamples` (20 ms at the context's
// 48 kHz), each posted to the main thread as a Float32Array.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor({ processorOptions }) {
    super();
    this.frameSamples = processorOptions.frameSamples;
    this.frame = new Float32Array(this.frameSamples);
    this.filled = 0;
  }

  process(inputs) {
    // No input yet (or a muted track): nothing to send.
    const channel = inputs[0][0];
    if (!channel) return true;
    let read = 0;
    while (read < channel.length) {
      const count = Math.min(channel.length - read, this.frame.length - this.filled);
      this.frame.set(channel.subarray(read, read + count), this.filled);
      read += count;
      this.filled += count;
      if (this.filled === this.frame.length) {
        this.port.postMessage(this.frame, [this.frame.buffer]);
        // The posted frame's buffer now belongs to the main thread: start a new one.
        this.frame = new Float32Array(this.frameSamples);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("capture", CaptureProcessor);
