// The page's audio: one AudioContext at the server's rate, the microphone
// tap (pcm16 chunks and a level), and the player (per-response counts of
// what was really played).

export const RATE = 24000; // the server's default pcm16 rate, both ways
const CHUNK_MS = 40; // microphone audio per input_audio_buffer.append
const JITTER_MS = 120;

export class MicrophoneError extends Error {}

// What getUserMedia's refusals mean to a person.
function microphoneMessage(err) {
  switch (err && err.name) {
    case "NotAllowedError":
    case "SecurityError":
      return (
        "The browser refused the microphone. Allow microphone access for this " +
        "page (the icon in the address bar or the site settings) and press Start again."
      );
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone was found. Connect one and press Start again.";
    case "NotReadableError":
    case "AbortError":
      return "The microphone is in use by another program or could not be opened.";
    default:
      return `The microphone could not be opened: ${err && err.message ? err.message : err}`;
  }
}

export function pcm16ToFloat(text) {
  const binary = atob(text);
  const view = new DataView(new ArrayBuffer(binary.length));
  for (let i = 0; i < binary.length; i++) view.setUint8(i, binary.charCodeAt(i));
  const out = new Float32Array(binary.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(i * 2, true) / 32768;
  return out;
}

export function pcm16BytesToFloat(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(i * 2, true) / 32768;
  return out;
}

// Linear interpolation between sample rates; enough for speech.
function resample(samples, from, to) {
  if (from === to) return samples;
  const out = new Float32Array(Math.round((samples.length * to) / from));
  const step = from / to;
  for (let i = 0; i < out.length; i++) {
    const x = i * step;
    const left = Math.floor(x);
    const right = Math.min(left + 1, samples.length - 1);
    out[i] = samples[left] + (samples[right] - samples[left]) * (x - left);
  }
  return out;
}

export class AudioIO {
  // onChunk(pcm16, durationMs, wallMs): a microphone chunk is ready;
  // onLevel(0..1); onStarted(responseId): its first sample is playing;
  // onPlayed(map of response id -> ms played).
  constructor({ onChunk, onLevel, onStarted, onPlayed }) {
    this.onChunk = onChunk;
    this.onLevel = onLevel;
    this.onStarted = onStarted;
    this.onPlayed = onPlayed;
    this.pending = [];
    this.pendingSamples = 0;
    this.peak = 0;
    this.clearWaiters = [];
  }

  // Opens the microphone first: a refusal is the first thing a person can
  // fix, so it is said before any network work.
  async open() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new MicrophoneError(
        "This page cannot reach a microphone here: browsers allow it only on " +
          "https:// pages or on localhost.",
      );
    }
    this.context = new AudioContext({ sampleRate: RATE });
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        // Echo cancellation keeps the assistant's own voice from sounding
        // like a barge-in; gain control and noise suppression are off because
        // they clip and smear speech in ways that cost the recogniser more
        // than they help.
        audio: {
          echoCancellation: true,
          autoGainControl: false,
          noiseSuppression: false,
          channelCount: 1,
        },
      });
    } catch (err) {
      await this.context.close();
      throw new MicrophoneError(microphoneMessage(err));
    }
    await this.context.audioWorklet.addModule("/static/audio-worklet.js");
    this.source = this.context.createMediaStreamSource(this.stream);
    this.capture = new AudioWorkletNode(this.context, "capture");
    this.capture.port.onmessage = (event) => this.onBlock(event.data);
    this.source.connect(this.capture);
    this.player = new AudioWorkletNode(this.context, "player", {
      outputChannelCount: [1],
      processorOptions: { jitterSamples: Math.round((RATE * JITTER_MS) / 1000) },
    });
    this.player.port.onmessage = (event) => this.onPlayer(event.data);
    this.player.connect(this.context.destination);
    await this.context.resume();
  }

  onBlock(block) {
    for (const v of block) this.peak = Math.max(this.peak, Math.abs(v));
    this.pending.push(block);
    this.pendingSamples += block.length;
    if (this.pendingSamples < (this.context.sampleRate * CHUNK_MS) / 1000) return;
    const pcm = new Int16Array(this.pendingSamples);
    let at = 0;
    for (const chunk of this.pending) {
      for (const v of chunk) pcm[at++] = Math.max(-32768, Math.min(32767, v * 32768));
    }
    const durationMs = (pcm.length * 1000) / this.context.sampleRate;
    this.pending = [];
    this.pendingSamples = 0;
    this.onLevel(this.peak);
    this.peak = 0;
    this.onChunk(pcm, durationMs, performance.now());
  }

  onPlayer(message) {
    if (message.type === "started") {
      this.onStarted(message.id);
      return;
    }
    const played = toMs(message.played, this.context.sampleRate);
    this.onPlayed(played);
    if (message.type === "cleared") {
      const waiters = this.clearWaiters;
      this.clearWaiters = [];
      for (const resolve of waiters) resolve(played);
    }
  }

  play(responseId, base64, rate) {
    this.push(responseId, pcm16ToFloat(base64), rate);
  }

  // bytes: a Uint8Array of pcm16 (a binary audio frame's payload).
  playPcm(responseId, bytes, rate) {
    this.push(responseId, pcm16BytesToFloat(bytes), rate);
  }

  push(responseId, pcm, rate) {
    const samples = resample(pcm, rate || RATE, this.context.sampleRate);
    this.player.port.postMessage({ type: "push", id: responseId, samples }, [samples.buffer]);
  }

  // The answer's audio is all queued: let the tail play even if it is short.
  ended() {
    this.player.port.postMessage({ type: "end" });
  }

  // Drops what is queued; resolves with what each response had played then.
  clear() {
    return new Promise((resolve) => {
      this.clearWaiters.push(resolve);
      this.player.port.postMessage({ type: "clear" });
    });
  }

  close() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    if (this.context && this.context.state !== "closed") this.context.close();
  }
}

function toMs(played, rate) {
  const out = new Map();
  for (const [id, samples] of Object.entries(played || {})) out.set(id, (samples * 1000) / rate);
  return out;
}
