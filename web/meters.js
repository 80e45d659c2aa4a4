// Level meters: an AnalyserNode on a media stream, its RMS level drawn once per frame.

const FLOOR_DB = -60;
// The bar falls at this rate instead of following every frame: easier to read than a flicker.
const FALL_DB_PER_SECOND = 40;
// The number beside the bar and the ARIA value change this often; per frame they are noise.
const READOUT_INTERVAL_MS = 250;

export class LevelMeter {
  #analyser = null;
  #source = null;
  #samples = null;
  #shownDb = FLOOR_DB;
  #readoutAt = 0;

  constructor(element, readout) {
    this.element = element;
    this.readout = readout;
    // The bar is a fixed gradient; a mask over its unlit part shrinks as the level rises.
    this.mask = element.querySelector(".meter-mask");
    this.rms = 0;
    this.maxRms = 0; // since attach(): lets a check ask "was there ever sound?"
  }

  attach(context, stream) {
    this.detach();
    this.#source = context.createMediaStreamSource(stream);
    this.#analyser = context.createAnalyser();
    this.#analyser.fftSize = 2048;
    this.#samples = new Float32Array(this.#analyser.fftSize);
    // An analyser is processed without being connected onward, so nothing is played twice.
    this.#source.connect(this.#analyser);
    this.maxRms = 0;
  }

  detach() {
    this.#source?.disconnect();
    this.#source = this.#analyser = null;
    this.rms = 0;
    this.#shownDb = FLOOR_DB;
    this.#render(true);
  }

  update(elapsedSeconds, now) {
    if (!this.#analyser) return;
    this.#analyser.getFloatTimeDomainData(this.#samples);
    let sum = 0;
    for (const sample of this.#samples) sum += sample * sample;
    this.rms = Math.sqrt(sum / this.#samples.length);
    this.maxRms = Math.max(this.maxRms, this.rms);
    const db = Math.max(FLOOR_DB, 20 * Math.log10(this.rms || 1e-9));
    this.#shownDb = Math.max(db, this.#shownDb - FALL_DB_PER_SECOND * elapsedSeconds);
    const readout = now - this.#readoutAt >= READOUT_INTERVAL_MS;
    if (readout) this.#readoutAt = now;
    this.#render(readout);
  }

  // The number says what the bar shows (the falling level), so the two never disagree.
  #render(readout) {
    const fraction = (this.#shownDb - FLOOR_DB) / -FLOOR_DB;
    this.mask.style.transform = `scaleX(${(1 - fraction).toFixed(3)})`;
    if (!readout) return;
    const db = Math.round(this.#shownDb);
    const text = db <= FLOOR_DB ? "silent" : `${db} dB`;
    this.readout.textContent = this.#analyser ? text : "–";
    this.element.setAttribute("aria-valuenow", String(db));
    this.element.setAttribute("aria-valuetext", text);
  }
}

// Keeps every meter moving for as long as the page is open; idle meters cost a no-op each.
export function animateMeters(meters) {
  let last = performance.now();
  const frame = (now) => {
    const elapsed = (now - last) / 1000;
    last = now;
    for (const meter of meters) meter.update(elapsed, now);
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
