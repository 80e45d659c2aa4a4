// The events panel: what the server reported on the control channel and what the page did.

import { el } from "./dom.js";

const LOG_LIMIT = 200;

export class EventLog {
  constructor(list) {
    this.list = list;
  }

  // kind: "event" (from the server), "error" or "local" (the page's own steps); it sets colour.
  add(kind, tag, detail = "") {
    const time = el("time", { textContent: new Date().toLocaleTimeString() });
    const label = el("span", { className: "tag", textContent: tag });
    const item = el("li", {}, time, label, el("span", { className: "detail" }, detail));
    item.dataset.kind = kind;
    // Only follow new entries when the reader is already at the bottom, not reading back.
    const atBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 24;
    this.list.append(item);
    while (this.list.childElementCount > LOG_LIMIT) this.list.firstElementChild.remove();
    if (atBottom) this.list.scrollTop = this.list.scrollHeight;
  }

  // One server event, with its fields said in words instead of as JSON.
  addServerEvent(event) {
    const kind = event.type === "error" ? "error" : "event";
    this.add(kind, String(event.type ?? "message"), describe(event));
  }
}

function describe(event) {
  const { type, ...fields } = event;
  const utterance = event.id ? `“${event.id}”` : "";
  switch (type) {
    case "speech_queued":
    case "speech_started":
      return utterance;
    case "speech_finished": {
      const spoken = `${((event.position_ms ?? 0) / 1000).toFixed(2)} s spoken`;
      const parts = [utterance, spoken, event.interrupted ? "interrupted" : ""];
      return parts.filter(Boolean).join(" · ");
    }
    case "barge_in":
      return "you talked over the voice, so it stopped";
    case "error":
      return `${event.error}: ${event.message}`;
    default:
      return JSON.stringify(fields);
  }
}
