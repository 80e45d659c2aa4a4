// The microphone for a call, whatever carries it, and what to say when it cannot be opened.

// Browser noise suppression stays off so that what you hear is the server's denoiser.
const MIC_CONSTRAINTS = {
  audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false },
};
// What went wrong with getUserMedia, and what the person can do about it.
const MIC_PROBLEMS = {
  NotAllowedError: [
    "Microphone access was denied.",
    "Allow it in the browser's site settings and press Start again.",
  ],
  NotFoundError: ["No microphone was found.", "Connect one and press Start again."],
  NotReadableError: [
    "The microphone could not be started.",
    "Another application may be using it.",
  ],
  insecure: ["The microphone needs a secure page.", "Open this site over https or localhost."],
};

class MicrophoneError extends Error {
  constructor(name) {
    const [problem, fix] = MIC_PROBLEMS[name] ?? [
      `The microphone could not be opened (${name}).`,
      "Press Start to try again.",
    ];
    super(`${problem} ${fix}`);
    this.problem = problem;
  }
}

// The stream for a call of this kind, reported through notify(name, ...args): "onMicrophone"
// with the stream, or "onMicrophoneMissing" with the error. A speak session still works
// without a microphone (only barge-in by voice is lost), so there the failure is reported
// and the call goes on with null; a transform has nothing to process, so it throws.
export async function callMicrophone(kind, notify) {
  try {
    const stream = await openMicrophone();
    notify("onMicrophone", stream);
    return stream;
  } catch (err) {
    if (!(err instanceof MicrophoneError) || kind !== "speak") throw err;
    notify("onMicrophoneMissing", err);
    return null;
  }
}

async function openMicrophone() {
  // Outside https and localhost, browsers hide navigator.mediaDevices altogether.
  if (!navigator.mediaDevices?.getUserMedia) throw new MicrophoneError("insecure");
  try {
    return await navigator.mediaDevices.getUserMedia(MIC_CONSTRAINTS);
  } catch (err) {
    throw new MicrophoneError(err.name);
  }
}
