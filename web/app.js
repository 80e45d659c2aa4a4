// cosyrtc browser client: the page's controls wired to a call (call.js over WebRTC,
// socket-call.js over a WebSocket), its level meters (meters.js), the Live panel (live.js,
// fed by the call's browser figures) and the event log (log.js). Requests to the server go
// through api.js, which adds the access token when the server wants one.

import { accessToken, api, AuthError, isAuthFailure, setAccessToken } from "./api.js";
import { Call } from "./call.js";
import { el } from "./dom.js";
import { LivePanel } from "./live.js";
import { EventLog } from "./log.js";
import { animateMeters, LevelMeter } from "./meters.js";
import { optionFields, readOptions } from "./options.js";
import { SocketCall } from "./socket-call.js";

const STATS_INTERVAL_MS = 1000;
// The transport control's values, each with the call that speaks it and its name in the log.
const TRANSPORTS = {
  webrtc: { Call, name: "WebRTC" },
  websocket: { Call: SocketCall, name: "WebSocket" },
};

// Every element with an id, keyed by its camelCased id ("session-id" -> ui.sessionId).
const ui = {};
for (const node of document.querySelectorAll("[id]")) {
  ui[node.id.replace(/-(\w)/g, (_, letter) => letter.toUpperCase())] = node;
}

const log = new EventLog(ui.log);
const meters = {
  input: new LevelMeter(ui.meterIn, ui.meterInValue),
  output: new LevelMeter(ui.meterOut, ui.meterOutValue),
};
const livePanel = new LivePanel(ui);

let engines = [];
// The call in progress, or null. Each Start makes a new one; a stopped one calls nothing back.
let call = null;
// Made on the first Start: browsers only let audio start from a click or a key press.
let audioContext = null;
let statsTimer = 0;
let connectionState = "idle";
let channelOpen = false;

// ---- page state ----------------------------------------------------------------------------

function setMessage(text, isError = false) {
  ui.message.textContent = text;
  ui.status.dataset.tone = isError ? "error" : "info";
}

function setBadge(badge, state, text = state) {
  badge.dataset.state = state;
  badge.textContent = text;
}

function showSession(id) {
  ui.sessionId.textContent = id ?? "";
  ui.session.hidden = id === null;
}

function selectedEngine() {
  return engines.find((e) => e.name === ui.engine.value);
}

function updateControls() {
  const busy = call !== null;
  const canSpeak = busy && channelOpen && call.request.kind === "speak";
  const focused = document.activeElement;
  ui.start.disabled = busy || engines.length === 0;
  ui.stop.disabled = !busy;
  // Options only apply when a call starts, so they are locked while one runs.
  ui.settings.disabled = busy;
  ui.say.disabled = !canSpeak;
  ui.interrupt.disabled = !canSpeak;
  // Keep keyboard focus on a usable button instead of losing it to the page.
  if (focused instanceof HTMLButtonElement && focused.disabled) (busy ? ui.stop : ui.start).focus();
}

// ---- engines -------------------------------------------------------------------------------

async function loadEngines() {
  let body;
  try {
    const response = await api("/engines");
    if (isAuthFailure(response.status)) {
      askForToken();
      return;
    }
    if (!response.ok) throw new Error(`the server answered HTTP ${response.status}`);
    body = await response.json();
  } catch (err) {
    setMessage(`Could not load the engine list (${err.message}). Reload the page to retry.`, true);
    return;
  }
  ui.tokenForm.hidden = true;
  engines = body.engines ?? [];
  showUnavailable(body.unavailable ?? {});
  if (engines.length === 0) {
    setMessage("The server has no engines available.", true);
    return;
  }
  ui.engine.replaceChildren(...engines.map((e) => new Option(`${e.name} (${e.kind})`, e.name)));
  ui.engine.value = engines.some((e) => e.name === body.default) ? body.default : engines[0].name;
  renderEngine();
  updateControls();
  setMessage("Ready. Pick an engine and press Start.");
}

function showUnavailable(reasons) {
  const items = Object.entries(reasons).map(([name, why]) => el("li", {}, `${name}: ${why}`));
  ui.unavailableList.replaceChildren(...items);
  ui.unavailable.hidden = items.length === 0;
}

function renderEngine() {
  const engine = selectedEngine();
  const speaks = engine.kind === "speak";
  ui.engineDescription.textContent = engine.description ?? "";
  const facts = [engine.kind, `${engine.sample_rate / 1000} kHz`];
  if (!speaks) facts.push(`${engine.delay_ms} ms algorithmic delay`);
  ui.engineFacts.textContent = facts.join(" · ");
  const fields = optionFields(engine.options);
  ui.options.replaceChildren(...fields);
  ui.optionsGroup.hidden = fields.length === 0;
  ui.speakPanel.hidden = !speaks;
  livePanel.setKind(engine.kind);
}

// ---- access token --------------------------------------------------------------------------

// Shown only when the server answers 401 or 403: most servers ask for no token.
function askForToken() {
  const refused = accessToken() !== "";
  ui.tokenForm.hidden = false;
  setMessage(
    refused
      ? "The server did not accept this access token. Check it and try again."
      : "This server needs an access token. Enter it to continue.",
    refused,
  );
  ui.accessToken.focus();
}

function useToken() {
  const value = ui.accessToken.value.trim();
  if (!value) {
    setMessage("Enter the access token first.", true);
    ui.accessToken.focus();
    return;
  }
  setAccessToken(value);
  ui.accessToken.value = "";
  setMessage("Loading engines…");
  loadEngines();
}

// ---- the call ------------------------------------------------------------------------------

// request: what to call (the form's choice unless given: a call started again keeps its own).
async function start(request = chosenRequest()) {
  audioContext ??= new AudioContext();
  audioContext.resume();
  const current = new TRANSPORTS[request.transport].Call(request, callHandlers());
  call = current;
  channelOpen = false;
  livePanel.reset();
  updateControls();
  setBadge(ui.connectionState, "connecting");
  setMessage("Waiting for microphone access…");
  log.add("local", "start", describeRequest(request));
  try {
    await current.connect();
    showSession(current.sessionId);
  } catch (err) {
    // A call stopped meanwhile has cleaned up after itself; only a live one reports.
    if (call !== current) return;
    endCall(err.message, true);
    if (err instanceof AuthError) askForToken();
  }
}

function describeRequest({ engine, options, transport }) {
  const settings = Object.entries(options).map(([name, value]) => `${name} ${value}`);
  return [engine, ...settings, `over ${TRANSPORTS[transport].name}`].join(" · ");
}

function chosenRequest() {
  const engine = selectedEngine();
  const options = readOptions(ui.options);
  return { engine: engine.name, kind: engine.kind, options, transport: ui.transport.value };
}

function callHandlers() {
  return {
    onMicrophone(stream) {
      meters.input.attach(audioContext, stream);
      setMessage("Connecting to the server…");
    },
    onMicrophoneMissing(err) {
      log.add("error", "microphone", err.problem);
      const consequence = "you will hear the voice, but talking will not interrupt it.";
      setMessage(`${err.problem} Connecting anyway: ${consequence}`, true);
    },
    onTrack(stream) {
      ui.remote.srcObject = stream;
      // autoplay is normally enough after the Start click; play() covers browsers that disagree.
      ui.remote.play().catch(() => {});
      // Chrome only feeds a remote stream into Web Audio while a media element plays it.
      meters.output.attach(audioContext, stream);
    },
    onState: onConnectionState,
    onChannelOpen() {
      channelOpen = true;
      updateControls();
    },
    onMessage: onServerEvent,
    onReconnecting,
    onServerClosed() {
      endCall("The server ended the call. Press Start to call again.", true);
    },
    // The session went with its server; any server can take a new call at once.
    onSessionLost() {
      const { request } = call;
      endCall("The server lost the call; starting a new one…", true);
      start(request);
    },
    onLost(message) {
      endCall(message, true);
    },
    onMicrophoneEnded() {
      endCall("The microphone stopped. Press Start to try again.", true);
    },
  };
}

function onConnectionState(state) {
  connectionState = state;
  setBadge(ui.connectionState, state);
  if (state === "connected") {
    setMessage(connectedMessage());
    log.add("local", "connected", `session ${call.sessionId}`);
    startBrowserStats();
  } else if (state === "disconnected") {
    setMessage("The connection was interrupted; trying to recover…");
  }
}

// The call is moving to a new connection (call.js): no channel and no browser stats meanwhile.
function onReconnecting(attempt) {
  connectionState = "reconnecting";
  channelOpen = false;
  clearInterval(statsTimer);
  updateControls();
  setBadge(ui.connectionState, "reconnecting");
  setMessage("Reconnecting…");
  log.add("local", "reconnecting", `attempt ${attempt}`);
}

function connectedMessage() {
  const { engine, kind, options } = call.request;
  if (kind !== "speak") return `Connected. You are hearing your microphone through ${engine}.`;
  if (!call.stream) return "Connected without a microphone. Type something to say.";
  return options.barge_in === false
    ? "Connected. Type something to say; press Interrupt to stop it."
    : "Connected. Type something to say; talk over the voice to interrupt it.";
}

function endCall(message, isError = false) {
  if (!call) return;
  call.close();
  call = null;
  clearInterval(statsTimer);
  meters.input.detach();
  meters.output.detach();
  ui.remote.srcObject = null;
  connectionState = "idle";
  channelOpen = false;
  setBadge(ui.connectionState, "idle");
  setBadge(ui.speechState, "idle", "silent");
  showSession(null);
  updateControls();
  setMessage(message, isError);
  log.add(isError ? "error" : "local", "end", message);
}

// ---- measurements --------------------------------------------------------------------------

function startBrowserStats() {
  clearInterval(statsTimer);
  const current = call;
  const sampler = current.browserStats();
  statsTimer = setInterval(async () => {
    const sample = await sampler.sample().catch(() => null);
    if (call === current && sample) livePanel.addBrowserStats(sample);
  }, STATS_INTERVAL_MS);
}

function onServerEvent(event) {
  if (event.type === "stats") {
    livePanel.addServerStats(event);
    return;
  }
  log.addServerEvent(event);
  if (event.type === "speech_started") setBadge(ui.speechState, "speaking", "speaking");
  if (event.type === "speech_finished") setBadge(ui.speechState, "idle", "silent");
}

// ---- speaking ------------------------------------------------------------------------------

function say() {
  const text = ui.speakText.value.trim();
  if (!text || !call?.send({ type: "speak", text })) return;
  log.add("local", "speak", text);
  ui.speakText.value = "";
}

function interrupt() {
  if (call?.send({ type: "interrupt" })) log.add("local", "interrupt");
}

// ---- wiring --------------------------------------------------------------------------------

ui.engine.addEventListener("change", renderEngine);
ui.tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  useToken();
});
ui.callForm.addEventListener("submit", (event) => {
  event.preventDefault();
  if (!call) start();
});
ui.stop.addEventListener("click", () => endCall("Call ended. Press Start to call again."));
ui.speakForm.addEventListener("submit", (event) => {
  event.preventDefault();
  say();
});
// Enter says the text, as in a chat box; Shift+Enter still makes a new line.
ui.speakText.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.speakForm.requestSubmit();
  }
});
ui.interrupt.addEventListener("click", interrupt);
ui.volume.addEventListener("input", () => {
  const percent = ui.volume.valueAsNumber;
  ui.remote.volume = percent / 100;
  ui.volumeValue.textContent = `${percent} %`;
  ui.volume.setAttribute("aria-valuetext", `${percent} percent`);
});
window.addEventListener("pagehide", () => endCall("The page was closed."));

// A read-only view of the live state, for the browser tests and for anyone curious in the
// console: the levels are the meters' own readings, the stats the latest shown on the page.
window.cosyrtc = Object.freeze({
  snapshot: () => ({
    connectionState,
    channelOpen,
    engine: call?.request.engine ?? null,
    transport: call?.request.transport ?? null,
    sessionId: call?.sessionId ?? null,
    input: { rms: meters.input.rms, maxRms: meters.input.maxRms },
    output: { rms: meters.output.rms, maxRms: meters.output.maxRms },
    server: livePanel.server,
    browser: livePanel.browser,
  }),
});

animateMeters([meters.input, meters.output]);
loadEngines();
