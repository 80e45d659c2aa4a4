// The Live panel's numbers and chart, fed by the server's `stats` events (about once a second
// on the data channel) and by the browser's own getStats() samples (stats.js).

import { el } from "./dom.js";
import { LineChart } from "./chart.js";

export class LivePanel {
  // ui: the page's elements by camelCased id (latencyServer, statJitter, chart, ...).
  constructor(ui) {
    this.ui = ui;
    this.chart = new LineChart(ui.chart, [
      { key: "server", colorVar: "--series-1" },
      { key: "buffer", colorVar: "--series-2" },
      { key: "jitter", colorVar: "--series-3" },
    ]);
    this.server = null; // the latest stats event
    this.browser = null; // the latest BrowserStats sample
  }

  // A speak session has no input to time against its output: its latency is the first audio.
  setKind(kind) {
    const label = kind === "speak" ? "server text→audio" : "server in→out";
    this.ui.latencyServerLabel.textContent = label;
    this.ui.legendServer.textContent = label;
  }

  reset() {
    this.server = this.browser = null;
    this.#showServer(null);
    this.#showBrowser(null);
    this.chart.clear();
  }

  addServerStats(stats) {
    this.server = stats;
    this.#showServer(stats);
  }

  // The chart moves on the browser's clock; it plots the server's latest figure alongside.
  addBrowserStats(sample) {
    this.browser = sample;
    this.#showBrowser(sample);
    this.chart.push({
      server: serverLatency(this.server),
      buffer: sample.jitterBufferMs,
      jitter: sample.jitterMs,
    });
  }

  #showServer(stats) {
    showHeadline(this.ui.latencyServer, serverLatency(stats));
    this.ui.statP95.textContent = formatMs(stats?.in_to_out_ms_p95);
    this.ui.statEngineDelay.textContent = formatMs(stats?.engine_delay_ms);
    this.ui.statConcealed.textContent = formatCount(stats?.concealed);
  }

  #showBrowser(sample) {
    showHeadline(this.ui.latencyBuffer, sample?.jitterBufferMs);
    this.ui.statJitter.textContent = formatMs(sample?.jitterMs);
    this.ui.statRtt.textContent = formatMs(sample?.rttMs);
    this.ui.statLost.textContent = formatCount(sample?.packetsLost);
    this.ui.statBitrateIn.textContent = formatKbps(sample?.bitrateInKbps);
    this.ui.statBitrateOut.textContent = formatKbps(sample?.bitrateOutKbps);
  }
}

function serverLatency(stats) {
  return stats?.in_to_out_ms ?? stats?.first_audio_ms ?? null;
}

// The big numbers: the value, and its unit in a smaller type.
function showHeadline(node, value) {
  const [number, unit] = formatMs(value).split(" ");
  const small = el("span", { className: "unit", textContent: unit ? ` ${unit}` : "" });
  node.replaceChildren(number, small);
}

function formatMs(value) {
  if (!Number.isFinite(value)) return "–";
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ms`;
}

function formatCount(value) {
  return Number.isFinite(value) ? value.toLocaleString() : "–";
}

function formatKbps(value) {
  return Number.isFinite(value) ? `${Math.round(value)} kb/s` : "–";
}
