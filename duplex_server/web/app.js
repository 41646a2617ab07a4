// The voice page: microphone -> /v1/realtime?duplex=1 -> speaker, with live
// transcripts, playback acks and barge-in (the server decides; the page
// flushes its queue when told the answer was cut).
const SEND_EVERY_MS = 100;
const JITTER_MS = 120;
const SERVER_RATE = 24000; // what the server speaks

const state = {
  status: "idle",
  userTranscripts: [],
  assistantTranscripts: [],
  playedMs: 0,
  audioDeltas: 0,
  acks: 0,
  cleared: 0,
  errors: [],
};
window.duplexState = state;

const $ = (id) => document.getElementById(id);
let socket = null;
let context = null;
let player = null;
let microphone = null;
let pending = [];
let pendingSamples = 0;
let current = null; // {id, startSample, samples} of the answer being played
let lastPlayed = 0;
let ackTimer = null;
const assistantLines = new Map();

function setStatus(text) {
  state.status = text;
  $("status").textContent = text;
}

function addLine(kind, text) {
  const line = document.createElement("div");
  line.className = `line ${kind}`;
  line.textContent = `${kind === "user" ? "You" : "Assistant"}: ${text}`;
  $("log").appendChild(line);
  return line;
}

function toBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Int16Array(bytes.buffer);
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

function send(event) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(event));
}

function onMicrophone(block) {
  let peak = 0;
  for (const v of block) peak = Math.max(peak, Math.abs(v));
  $("level").style.width = `${Math.min(100, peak * 300)}%`;
  pending.push(block);
  pendingSamples += block.length;
  if (pendingSamples < (context.sampleRate * SEND_EVERY_MS) / 1000) return;
  const pcm = new Int16Array(pendingSamples);
  let at = 0;
  for (const chunk of pending) {
    for (const v of chunk) pcm[at++] = Math.max(-32768, Math.min(32767, v * 32768));
  }
  pending = [];
  pendingSamples = 0;
  send({
    type: "input_audio_buffer.append",
    audio: toBase64(pcm),
    sample_rate_hz: context.sampleRate,
  });
}

function onPlayed(played) {
  lastPlayed = played;
  if (!current) return;
  const mine = Math.max(0, Math.min(played - current.startSample, current.samples));
  state.playedMs = Math.round((mine * 1000) / context.sampleRate);
}

function sendAck() {
  if (!current || state.playedMs <= 0) return;
  send({ type: "playback.ack", played_ms: state.playedMs, response_id: current.id });
  state.acks += 1;
}

function flushPlayback() {
  player.port.postMessage({ type: "clear" });
  current = null;
  state.cleared += 1;
}

function onAudioDelta(event) {
  const pcm = fromBase64(event.delta);
  const floats = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) floats[i] = pcm[i] / 32768;
  const samples = resample(floats, event.sample_rate_hz || SERVER_RATE, context.sampleRate);
  if (!current || current.id !== event.response_id) {
    current = { id: event.response_id, startSample: lastPlayed, samples: 0 };
  }
  current.samples += samples.length;
  player.port.postMessage({ type: "push", samples }, [samples.buffer]);
  state.audioDeltas += 1;
}

function onServerEvent(event) {
  switch (event.type) {
    case "session.created":
      setStatus("listening");
      send({
        type: "session.update",
        session: { turn_detection: { type: "server_vad" } },
      });
      break;
    case "input_audio_buffer.speech_started":
      setStatus("hearing you");
      break;
    case "input_audio_buffer.speech_stopped":
      setStatus("thinking");
      break;
    case "conversation.item.input_audio_transcription.completed":
      state.userTranscripts.push(event.transcript);
      addLine("user", event.transcript || "(nothing heard)");
      break;
    case "response.output_audio_transcript.delta": {
      let line = assistantLines.get(event.response_id);
      if (!line) {
        line = { text: "", node: addLine("assistant", "") };
        assistantLines.set(event.response_id, line);
      }
      line.text += event.delta;
      line.node.textContent = `Assistant: ${line.text}`;
      break;
    }
    case "response.output_audio_transcript.done":
      state.assistantTranscripts.push(event.transcript);
      break;
    case "response.output_audio.delta":
      setStatus("speaking");
      onAudioDelta(event);
      break;
    case "output_audio_buffer.cleared":
      flushPlayback();
      setStatus("listening");
      break;
    case "response.done":
      sendAck();
      if (event.response.status !== "completed") flushPlayback();
      setStatus("listening");
      break;
    case "error":
      state.errors.push(event.error);
      console.warn("server error", event.error);
      break;
    default:
  }
}

async function start() {
  $("start").disabled = true;
  setStatus("starting");
  context = new AudioContext({ sampleRate: SERVER_RATE });
  await context.audioWorklet.addModule("/static/audio-worklet.js");
  const stream = await navigator.mediaDevices.getUserMedia({
    // Echo cancellation keeps the assistant's own voice from sounding like a
    // barge-in; gain control and noise suppression are off because they clip
    // and smear speech in ways that cost the recogniser more than they help.
    audio: {
      echoCancellation: true,
      autoGainControl: false,
      noiseSuppression: false,
      channelCount: 1,
    },
  });
  microphone = context.createMediaStreamSource(stream);
  const capture = new AudioWorkletNode(context, "capture");
  capture.port.onmessage = (event) => onMicrophone(event.data);
  microphone.connect(capture);
  player = new AudioWorkletNode(context, "player", {
    outputChannelCount: [1],
    processorOptions: { jitterSamples: Math.round((context.sampleRate * JITTER_MS) / 1000) },
  });
  player.port.onmessage = (event) => onPlayed(event.data.played);
  player.connect(context.destination);
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/v1/realtime?duplex=1`, await protocols());
  socket.onmessage = (message) => onServerEvent(JSON.parse(message.data));
  socket.onclose = () => setStatus("disconnected");
  ackTimer = setInterval(sendAck, 250);
  $("stop").disabled = false;
}

// A server with keys: trade the key the user typed for a client secret, so
// the key itself never rides in a WebSocket subprotocol.
async function protocols() {
  const key = $("key").value.trim();
  if (!key) return ["realtime"];
  const minted = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: "{}",
  });
  if (!minted.ok) throw new Error(`the key was refused (HTTP ${minted.status})`);
  const secret = await minted.json();
  return ["realtime", `openai-insecure-api-key.${secret.value}`];
}

function stop() {
  clearInterval(ackTimer);
  if (socket) socket.close();
  if (context) context.close();
  $("stop").disabled = true;
  $("start").disabled = false;
  setStatus("idle");
}

$("start").addEventListener("click", () => start().catch((err) => {
  state.errors.push(String(err));
  setStatus(`error: ${err.message || err}`);
}));
$("stop").addEventListener("click", stop);
