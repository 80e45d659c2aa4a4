// A small live line chart drawn on a <canvas>: the last minute of a few series in milliseconds.
// Colours and fonts come from CSS (custom properties on the canvas), so themes apply to it.

const WINDOW_MS = 60_000;
const MIN_SCALE_MS = 10; // a flat, tiny series still gets a readable axis
// Gaps between grid lines for each leading digit of the axis maximum: round labels each time.
const GRID_STEPS = { 1: 0.2, 2: 0.5, 5: 1 };
const PADDING = { top: 10, right: 12, bottom: 22, label: 8 };

export class LineChart {
  #points = []; // {time, values: {key: number | null}}

  // series: [{key, colorVar}], drawn in order, the first one with a soft fill under it.
  constructor(canvas, series) {
    this.canvas = canvas;
    this.series = series;
    new ResizeObserver(() => this.draw()).observe(canvas);
    // A theme switch changes the colours the chart reads from CSS.
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.draw());
  }

  push(values, time = performance.now()) {
    this.#points.push({ time, values });
    while (this.#points.length && this.#points[0].time < time - WINDOW_MS) this.#points.shift();
    this.draw();
  }

  clear() {
    this.#points = [];
    this.draw();
  }

  draw() {
    const ctx = this.#prepare();
    const { width, height } = this.canvas.getBoundingClientRect();
    const style = getComputedStyle(this.canvas);
    ctx.font = `12px ${style.fontFamily}`;
    const axis = niceAxis(Math.max(MIN_SCALE_MS, this.#largest()));
    // The plot starts where the widest axis label ends, at any font size.
    const left = Math.ceil(ctx.measureText(`${axis.max} ms`).width) + PADDING.label;
    const area = {
      x: left,
      y: PADDING.top,
      w: width - left - PADDING.right,
      h: height - PADDING.top - PADDING.bottom,
    };
    if (area.w <= 0 || area.h <= 0) return;
    this.#drawGrid(ctx, area, axis, style);
    if (this.#points.length === 0) {
      this.#drawEmpty(ctx, area, style);
      return;
    }
    const now = this.#points.at(-1).time;
    const x = (time) => area.x + area.w * (1 - (now - time) / WINDOW_MS);
    const y = (value) => area.y + area.h * (1 - Math.min(value, axis.max) / axis.max);
    this.series.forEach((series, index) => {
      const color = style.getPropertyValue(series.colorVar).trim();
      const runs = this.#runs(series.key).map((run) => run.map((p) => [x(p.time), y(p.value)]));
      if (index === 0) for (const run of runs) fillUnder(ctx, run, area, color);
      for (const run of runs) strokeLine(ctx, run, color);
    });
  }

  // Sizes the backing store to the element in device pixels, so lines stay crisp.
  #prepare() {
    const ratio = window.devicePixelRatio || 1;
    const { width, height } = this.canvas.getBoundingClientRect();
    const w = Math.round(width * ratio);
    const h = Math.round(height * ratio);
    if (this.canvas.width !== w || this.canvas.height !== h) {
      this.canvas.width = w;
      this.canvas.height = h;
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return ctx;
  }

  #largest() {
    let largest = 0;
    for (const { values } of this.#points) {
      for (const { key } of this.series) largest = Math.max(largest, values[key] ?? 0);
    }
    return largest;
  }

  // A series' points split where a value is missing, so gaps show as gaps.
  #runs(key) {
    const runs = [[]];
    for (const { time, values } of this.#points) {
      const value = values[key];
      if (Number.isFinite(value)) runs.at(-1).push({ time, value });
      else if (runs.at(-1).length) runs.push([]);
    }
    return runs.filter((run) => run.length);
  }

  #drawGrid(ctx, area, axis, style) {
    ctx.strokeStyle = style.getPropertyValue("--chart-grid").trim();
    ctx.fillStyle = style.getPropertyValue("--chart-text").trim();
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let value = 0; value <= axis.max + axis.step / 2; value += axis.step) {
      const y = Math.round(area.y + area.h * (1 - value / axis.max)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(area.x, y);
      ctx.lineTo(area.x + area.w, y);
      ctx.stroke();
      ctx.fillText(`${Number(value.toPrecision(3))} ms`, area.x - PADDING.label, y);
    }
    ctx.textBaseline = "top";
    const bottom = area.y + area.h + 6;
    ctx.textAlign = "left";
    ctx.fillText("−60 s", area.x, bottom);
    ctx.textAlign = "center";
    ctx.fillText("−30 s", area.x + area.w / 2, bottom);
    ctx.textAlign = "right";
    ctx.fillText("now", area.x + area.w, bottom);
  }

  #drawEmpty(ctx, area, style) {
    ctx.fillStyle = style.getPropertyValue("--chart-text").trim();
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText("Start a call to see its latency", area.x + area.w / 2, area.y + area.h / 2);
  }
}

function strokeLine(ctx, run, color) {
  ctx.strokeStyle = color;
  ctx.lineWidth = 2;
  ctx.lineJoin = "round";
  ctx.lineCap = "round";
  ctx.beginPath();
  run.forEach(([x, y], i) => (i === 0 ? ctx.moveTo(x, y) : ctx.lineTo(x, y)));
  ctx.stroke();
  // The newest value gets a dot: a single point would otherwise draw nothing.
  const [x, y] = run.at(-1);
  ctx.fillStyle = color;
  ctx.beginPath();
  ctx.arc(x, y, 3, 0, 2 * Math.PI);
  ctx.fill();
}

function fillUnder(ctx, run, area, color) {
  if (run.length < 2) return;
  const gradient = ctx.createLinearGradient(0, area.y, 0, area.y + area.h);
  gradient.addColorStop(0, color);
  gradient.addColorStop(1, "transparent");
  ctx.save();
  ctx.globalAlpha = 0.22;
  ctx.fillStyle = gradient;
  ctx.beginPath();
  ctx.moveTo(run[0][0], area.y + area.h);
  for (const [x, y] of run) ctx.lineTo(x, y);
  ctx.lineTo(run.at(-1)[0], area.y + area.h);
  ctx.closePath();
  ctx.fill();
  ctx.restore();
}

// The axis maximum: the smallest 1, 2 or 5 times a power of ten that holds `value`, with
// the gap between its grid lines.
function niceAxis(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  const digit = [1, 2, 5, 10].find((m) => m * power >= value);
  if (digit === 10) return { max: 10 * power, step: 2 * power };
  return { max: digit * power, step: GRID_STEPS[digit] * power };
}
