// cosyrtc browser client: sends the microphone to the server over WebRTC, with the engine and
// options chosen in the form, and plays back the audio the engine returns.

// Browser noise suppression stays off so that what you hear is the server's denoiser.
const MIC_CONSTRAINTS = {
  audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false },
};
// The server does not take trickled candidates, so the offer waits for gathering to finish.
// Some browsers never report "complete" on odd networks; after this long, send what we have.
const ICE_GATHERING_TIMEOUT_MS = 5000;
const LOG_LIMIT = 200;
// What to tell the user for each getUserMedia failure they can do something about.
const MIC_ERRORS = {
  NotAllowedError:
    "Microphone access was denied. Allow it in the browser's site settings and press Start again.",
  NotFoundError: "No microphone was found. Connect one and press Start again.",
  NotReadableError: "The microphone could not be started. Another application may be using it.",
};

// Every element with an id, keyed by its camelCased id ("session-id" -> ui.sessionId).
const ui = {};
for (const node of document.querySelectorAll("[id]")) {
  ui[node.id.replace(/-(\w)/g, (_, letter) => letter.toUpperCase())] = node;
}

let engines = [];
// The call in progress, or null. Every Start makes a new object, so the async steps of a call
// that was stopped meanwhile can tell they are stale and undo only their own work.
let call = null;

// ---- page helpers --------------------------------------------------------------------------

// document.createElement with properties assigned and children appended.
function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

function setMessage(text, isError = false) {
  ui.message.textContent = text;
  ui.status.dataset.tone = isError ? "error" : "info";
}

function log(text) {
  const time = el("time", { textContent: new Date().toLocaleTimeString() });
  ui.log.append(el("li", {}, time, " ", text));
  while (ui.log.childElementCount > LOG_LIMIT) ui.log.firstElementChild.remove();
  ui.log.scrollTop = ui.log.scrollHeight;
}

function updateControls() {
  const busy = call !== null;
  const focused = document.activeElement;
  ui.start.disabled = busy || engines.length === 0;
  ui.stop.disabled = !busy;
  // Options only apply when a call starts, so they are locked while one runs.
  ui.settings.disabled = busy;
  // Keep keyboard focus on a usable button instead of losing it to the page.
  if (focused instanceof HTMLButtonElement && focused.disabled) (busy ? ui.stop : ui.start).focus();
}

// ---- engines and their options form --------------------------------------------------------

async function loadEngines() {
  let body;
  try {
    const response = await fetch("/engines");
    if (!response.ok) throw new Error(`the server answered HTTP ${response.status}`);
    body = await response.json();
  } catch (err) {
    setMessage(`Could not load the engine list (${err.message}). Reload the page to retry.`, true);
    return;
  }
  engines = body.engines ?? [];
  showUnavailable(body.unavailable ?? {});
  if (engines.length === 0) {
    setMessage("The server has no engines available.", true);
    return;
  }
  ui.engine.replaceChildren(...engines.map((e) => new Option(e.name, e.name)));
  ui.engine.value = engines.some((e) => e.name === body.default) ? body.default : engines[0].name;
  renderEngine();
  updateControls();
  setMessage("Ready. Press Start and allow the microphone.");
}

function showUnavailable(reasons) {
  const items = Object.entries(reasons).map(([name, reason]) =>
    el("li", { textContent: `${name}: ${reason}` }),
  );
  ui.unavailableList.replaceChildren(...items);
  ui.unavailable.hidden = items.length === 0;
}

function renderEngine() {
  const engine = engines.find((e) => e.name === ui.engine.value);
  ui.engineDescription.textContent = engine.description ?? "";
  const rate = `${engine.sample_rate / 1000} kHz`;
  ui.engineFacts.textContent = `${engine.kind} · ${rate} · ${engine.delay_ms} ms delay`;
  const properties = Object.entries(engine.options?.properties ?? {});
  ui.options.replaceChildren(...properties.map(([name, schema]) => optionField(name, schema)));
  ui.optionsGroup.hidden = properties.length === 0;
}

function optionField(name, schema) {
  const input = Object.assign(optionInput(schema), { id: `option-${name}`, name });
  const label = el("label", { htmlFor: input.id, textContent: name.replaceAll("_", " ") });
  const isCheckbox = input.type === "checkbox";
  const row = el("div", { className: isCheckbox ? "field field-check" : "field" });
  row.append(...(isCheckbox ? [input, label] : [label, input]));
  if (schema.description) {
    const hint = el("p", { id: `${input.id}-hint`, className: "hint" }, schema.description);
    input.setAttribute("aria-describedby", hint.id);
    row.append(hint);
  }
  return row;
}

function optionInput(schema) {
  if (schema.type === "boolean") {
    return el("input", { type: "checkbox", checked: Boolean(schema.default) });
  }
  if (Array.isArray(schema.enum)) {
    const select = el("select", {}, ...schema.enum.map((choice) => new Option(choice, choice)));
    select.value = schema.default ?? schema.enum[0];
    return select;
  }
  if (schema.type === "number" || schema.type === "integer") {
    return el("input", {
      type: "number",
      step: schema.type === "integer" ? "1" : "any",
      min: schema.minimum ?? "",
      max: schema.maximum ?? "",
      // With a default to fall back on, an empty box is a mistake the browser should point out.
      required: typeof schema.default === "number",
      value: schema.default ?? "",
    });
  }
  return el("input", { type: "text", value: schema.default ?? "" });
}

function readOptions() {
  const options = {};
  for (const input of ui.options.querySelectorAll("[name]")) {
    if (input.type === "checkbox") options[input.name] = input.checked;
    else if (input.type !== "number") options[input.name] = input.value;
    // An empty optional number is left out so the server applies its own default.
    else if (!Number.isNaN(input.valueAsNumber)) options[input.name] = input.valueAsNumber;
  }
  return options;
}

// ---- the call ------------------------------------------------------------------------------

async function start() {
  const current = { engine: ui.engine.value, options: readOptions() };
  call = current;
  updateControls();
  try {
    await connect(current);
  } catch (err) {
    // A stopped call has already been reset; only release what its late steps acquired.
    if (call === current) endCall(err.message, true);
    else teardown(current);
  }
}

async function connect(c) {
  setMessage("Waiting for microphone access…");
  c.stream = await openMicrophone();
  assertCurrent(c);
  const [track] = c.stream.getAudioTracks();
  track.addEventListener("ended", () => {
    if (call === c) endCall("The microphone stopped. Press Start to try again.", true);
  });
  c.pc = createPeerConnection(c, track);
  setMessage("Connecting to the server…");
  await c.pc.setLocalDescription(await c.pc.createOffer());
  await iceGatheringComplete(c.pc);
  assertCurrent(c);
  const answer = await postOffer(c.pc.localDescription.sdp, c.engine, c.options);
  // Recorded before the check so that a call stopped meanwhile still deletes its session.
  c.sessionId = answer.session_id;
  assertCurrent(c);
  ui.sessionId.textContent = c.sessionId;
  await c.pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
}

function assertCurrent(c) {
  if (call !== c) throw new Error("call stopped");
}

async function openMicrophone() {
  // Outside https and localhost, browsers hide navigator.mediaDevices altogether.
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error("The microphone needs a secure page: open this site over https or localhost.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
  } catch (err) {
    throw new Error(MIC_ERRORS[err.name] ?? `The microphone could not be opened (${err.name}).`);
  }
}

function createPeerConnection(c, track) {
  const pc = new RTCPeerConnection({ iceServers: [] });
  pc.addTransceiver(track, { direction: "sendrecv", streams: [c.stream] });
  pc.addEventListener("track", (event) => {
    if (call !== c) return;
    ui.remote.srcObject = event.streams[0] ?? new MediaStream([event.track]);
    // autoplay is normally enough after the Start click; play() covers browsers that disagree.
    ui.remote.play().catch(() => {});
  });
  pc.addEventListener("connectionstatechange", () => onConnectionState(c));
  openControlChannel(pc);
  return pc;
}

function onConnectionState(c) {
  if (call !== c) return;
  const state = c.pc.connectionState;
  ui.connectionState.textContent = state;
  if (state === "connected") {
    setMessage(`Connected. You are hearing your microphone through "${c.engine}".`);
  } else if (state === "disconnected") {
    setMessage("The connection was interrupted; trying to recover…");
  } else if (state === "failed") {
    endCall("The connection to the server failed. Press Start to try again.", true);
  } else if (state === "closed") {
    endCall("The connection was closed. Press Start to call again.");
  }
}

// Later features send their messages here; for now they are only shown in the log panel.
function openControlChannel(pc) {
  const channel = pc.createDataChannel("control");
  channel.addEventListener("open", () => log("control channel open"));
  channel.addEventListener("message", (event) => {
    try {
      log(JSON.stringify(JSON.parse(event.data)));
    } catch {
      log(`(not JSON) ${event.data}`);
    }
  });
}

function iceGatheringComplete(pc) {
  return new Promise((resolve) => {
    const check = () => pc.iceGatheringState === "complete" && resolve();
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, ICE_GATHERING_TIMEOUT_MS);
    check();
  });
}

async function postOffer(sdp, engine, options) {
  const response = await fetch("/offer", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ sdp, type: "offer", engine, options }),
  }).catch(() => {
    throw new Error("Could not reach the server. Check that it is running and press Start again.");
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(body?.message ?? `The server refused the call (HTTP ${response.status}).`);
  }
  if (typeof body?.sdp !== "string") throw new Error("The server's answer could not be read.");
  return body;
}

// Safe to call more than once: each resource is released at most once.
function teardown(c) {
  if (c.sessionId) {
    // keepalive lets the request finish even when the page is being closed.
    const url = `/sessions/${encodeURIComponent(c.sessionId)}`;
    fetch(url, { method: "DELETE", keepalive: true }).catch(() => {});
    c.sessionId = null;
  }
  c.pc?.close();
  c.stream?.getTracks().forEach((track) => track.stop());
}

function endCall(message, isError = false) {
  if (!call) return;
  teardown(call);
  call = null;
  ui.remote.srcObject = null;
  ui.connectionState.textContent = "not connected";
  ui.sessionId.textContent = "none";
  updateControls();
  setMessage(message, isError);
}

// ---- wiring --------------------------------------------------------------------------------

ui.engine.addEventListener("change", renderEngine);
ui.callForm.addEventListener("submit", (event) => {
  event.preventDefault();
  if (!call) start();
});
ui.stop.addEventListener("click", () => endCall("Call ended. Press Start to call again."));
window.addEventListener("pagehide", () => endCall(""));

loadEngines();
