// The audio of a WebSocket call, in its own AudioContext at the wire's 48 kHz: the microphone
// cut into 20 ms frames (capture-worklet.js), and the server's frames played through a small
// jitter buffer (playout-worklet.js) into a MediaStream the page plays and meters like a
// WebRTC call's remote stream.

export const SAMPLE_RATE = 48000;
export const FRAME_SAMPLES = SAMPLE_RATE / 50; // 20 ms
export const FRAME_MS = 20;
const TARGET_FRAMES = 3; // 60 ms buffered before playing
const MAX_FRAMES = 10; // 200 ms at most: the oldest frames go beyond it

export class SocketAudio {
  #playout = null;
  #output = null;

  // Made before the call's first await, while the Start click still allows audio to start.
  constructor() {
    this.context = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: "interactive" });
    this.context.resume();
  }

  // microphone: a MediaStream or null. onFrame(samples): each captured 20 ms Float32Array.
  // onPlayed(seq, bufferedFrames): each frame played, and how many wait after it.
  async start(microphone, { onFrame, onPlayed }) {
    await Promise.all([
      this.context.audioWorklet.addModule("/capture-worklet.js"),
      this.context.audioWorklet.addModule("/playout-worklet.js"),
    ]);
    this.#playout = new AudioWorkletNode(this.context, "playout", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: {
        frameSamples: FRAME_SAMPLES,
        targetFrames: TARGET_FRAMES,
        maxFrames: MAX_FRAMES,
      },
    });
    this.#playout.port.onmessage = ({ data }) => onPlayed(data.played, data.bufferedFrames);
    this.#output = this.context.createMediaStreamDestination();
    this.#playout.connect(this.#output);
    if (microphone) {
      // No outputs: a sink the context runs by itself, and nothing of the microphone is heard.
      const capture = new AudioWorkletNode(this.context, "capture", {
        numberOfOutputs: 0,
        channelCount: 1,
        channelCountMode: "explicit",
        processorOptions: { frameSamples: FRAME_SAMPLES },
      });
      capture.port.onmessage = ({ data }) => onFrame(data);
      this.context.createMediaStreamSource(microphone).connect(capture);
    }
  }

  // What the server sent, as the page plays it.
  get stream() {
    return this.#output.stream;
  }

  // frame: {seq, samples}, samples a Float32Array of FRAME_SAMPLES or null for silence.
  play(frame) {
    this.#playout.port.postMessage(frame, frame.samples ? [frame.samples.buffer] : []);
  }

  // Drops every frame not played yet.
  clear() {
    this.#playout?.port.postMessage("clear");
  }

  close() {
    this.context.close().catch(() => {});
  }
}
