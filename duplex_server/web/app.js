// The voice page: microphone -> server -> speaker, with live transcripts,
// barge-in (the server decides; the page stops playing and says where the
// answer was cut) and resume after a dropped connection. Two transports with
// one interface: WebRTC (rtc-call.js: Opus tracks both ways, the server
// acknowledges playback from its own track) where the server and browser
// offer it, else the WebSocket (call.js, /v1/realtime?duplex=1&audio=binary:
// pcm16 in binary frames, and the page acknowledges what it played, so the
// server's history holds what was heard, no more).
import { AudioIO, MicrophoneError } from "./audio.js";
import { Call, Fatal } from "./call.js";
import { RtcCall, Unavailable } from "./rtc-call.js";
import { Conversation } from "./transcript.js";

const ACK_EVERY_MS = 250;
const INTERRUPTED_SHOWN_MS = 1500;
const INPUT_MAP_MS = 60000; // how far back speech ends can be placed in time
const TRANSPORTS = ["auto", "webrtc", "websocket"];

const $ = (id) => document.getElementById(id);
const conversation = new Conversation($("conversation"));
let models = [];
let call = null;
let audio = null;
let page = null; // the live call's bookkeeping

// ---- what the page says -------------------------------------------------
// #alert: why the call cannot go on (or start); #notice: the connection;
// #server: the latest thing the server refused or warned about.

function say(kind, text) {
  const node = $(kind);
  node.textContent = text || "";
  node.hidden = !text;
}

function showState(state) {
  const node = $("state");
  if (node.dataset.state === state) return;
  node.dataset.state = state;
  node.textContent = state;
}

// The visible state, from what is true now.
function refreshState() {
  if (!page) return;
  const now = performance.now();
  if (page.link !== "open") return showState(page.link);
  if (now < page.interruptedUntil) return showState("interrupted");
  if (page.userSpeaking) return showState("hearing you");
  if (page.playing()) return showState("speaking");
  if (page.awaiting) return showState("thinking");
  showState("listening");
}

function setLevel(peak) {
  const percent = Math.min(100, Math.round(Math.sqrt(peak) * 100));
  $("level").style.width = `${percent}%`;
  $("level").parentElement.setAttribute("aria-valuenow", String(percent));
}

// ---- the model and its capabilities ------------------------------------

const CAPABILITY_LABELS = [
  ["supports_barge_in", "barge-in"],
  ["supports_session_resume", "resume after a drop"],
  ["supports_audio_truncate", "exact truncation"],
  ["supports_playback_ack", "playback acks"],
  ["supports_model_native_turn_policy", "native turn-taking"],
];

// Why a model cannot hold this page's conversation; empty when it can.
function unfit(model) {
  const caps = model.capabilities || {};
  const reasons = [];
  if (!(caps.input_modes || []).includes("audio")) reasons.push("it takes no audio input");
  if (!(caps.output_formats || []).includes("pcm16")) reasons.push("it does not speak");
  const hears = (caps.signal_sources || []).some(
    (source) => source === "server_policy" || source === "model_native",
  );
  if (!hears) {
    reasons.push(
      "it does not listen for speech (no voice activity detection or turn-taking of its own)",
    );
  }
  return reasons;
}

function unfitMessage(model) {
  const reasons = unfit(model);
  if (!reasons.length) return "";
  return (
    `The model “${model.id}” cannot hold a spoken conversation: ${reasons.join("; ")}. ` +
    "Start the server with a voice model (duplex-server serve --model cascade)."
  );
}

function selectedModel() {
  return models.find((model) => model.id === $("model").value);
}

function showModel() {
  const model = selectedModel();
  const list = $("capabilities");
  list.replaceChildren();
  if (!model) return;
  const caps = model.capabilities || {};
  const chips = [];
  if (caps.implementation_level) chips.push([caps.implementation_level, true]);
  const hears = (caps.signal_sources || []).includes("server_policy");
  chips.push(["hears when you stop", hears || caps.supports_model_native_turn_policy]);
  for (const [field, label] of CAPABILITY_LABELS) {
    if (field in caps) chips.push([label, Boolean(caps[field])]);
  }
  if (caps.chunk_period_ms) chips.push([`${caps.chunk_period_ms} ms chunks`, true]);
  for (const [label, yes] of chips) {
    const chip = document.createElement("li");
    chip.className = yes ? "yes" : "no";
    chip.textContent = yes ? label : `no ${label}`;
    list.appendChild(chip);
  }
  const problem = unfitMessage(model);
  say("alert", problem);
  $("start").disabled = Boolean(problem) || call !== null;
}

async function loadModels() {
  try {
    const response = await fetch("/v1/models", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    // OpenAI's realtime names are aliases (a parent): list the served names.
    models = ((await response.json()).data || []).filter((model) => !model.parent);
  } catch (err) {
    say("alert", `Could not ask the server which models it runs (${err.message}). Is it running?`);
    return;
  }
  const select = $("model");
  select.replaceChildren();
  for (const model of models) {
    const option = document.createElement("option");
    option.value = model.id;
    option.textContent = model.id;
    select.appendChild(option);
  }
  const remembered = localStorage.getItem("duplex.model");
  if (models.some((model) => model.id === remembered)) select.value = remembered;
  showModel();
}

// ---- one call -----------------------------------------------------------

class PageCall {
  constructor(capabilities) {
    this.capabilities = capabilities;
    this.link = "connecting";
    this.userSpeaking = false;
    this.awaiting = false; // a turn was taken and its answer has not started playing
    this.interruptedUntil = 0;
    this.speechEnd = null; // wall time the last taken turn's speech ended
    this.inputMs = 0; // input audio sent so far (the server's input timeline)
    this.inputMap = []; // [input ms at a chunk's end, wall ms then]
    this.silenceMs = 500;
    this.latencies = [];
    this.live = new Set(); // answers whose playback is still being acknowledged
    this.current = null;
  }

  playing() {
    const answer = this.current;
    return answer !== null && answer.started && answer.cut === null && !answer.fullyPlayed;
  }

  // Where the server's input timeline position `ms` was, on the wall clock.
  // `fallback` (when the server said so, less its silence wait) stands in
  // for a position the page no longer holds or never sent.
  wallAt(ms, fallback) {
    const after = this.inputMap.find(([end]) => end >= ms);
    if (!after) return fallback;
    return Math.min(after[1] - (after[0] - ms), fallback);
  }

  sentChunk(durationMs, wallMs) {
    this.inputMs += durationMs;
    this.inputMap.push([this.inputMs, wallMs]);
    while (this.inputMap.length && wallMs - this.inputMap[0][1] > INPUT_MAP_MS) {
      this.inputMap.shift();
    }
  }
}

function onChunk(pcm, durationMs, wallMs) {
  if (!call || !page) return;
  if (call.audioOnTracks) {
    // The microphone goes on the peer connection's track; the chunk only
    // keeps the map from the server's input timeline to the wall clock.
    if (call.attached) page.sentChunk(durationMs, wallMs);
    return;
  }
  // While the link is down the microphone is not buffered: the conversation
  // pauses and carries on from what is said after it is back.
  // One binary input frame: the append without base64 (call.js).
  const sent = call.sendAudio(pcm, audio.context.sampleRate);
  if (sent) page.sentChunk(durationMs, wallMs);
}

function onPlayed(played) {
  if (!page) return;
  let finished = false;
  for (const [id, ms] of played) {
    const answer = conversation.answers.get(id);
    if (!answer) continue;
    answer.played(ms);
    finished ||= answer.fullyPlayed && !answer.finalAckSent;
  }
  if (finished) sendAcks(); // the whole answer was heard: say so now, not at the next tick
}

function onStarted(responseId) {
  if (!page) return;
  const answer = conversation.answers.get(responseId);
  if (!answer) return;
  answer.started = true;
  page.awaiting = false;
  if (answer.speechEnd !== undefined && answer.speechEnd !== null) {
    const ms = performance.now() - answer.speechEnd;
    answer.latency(ms);
    page.latencies.push(ms);
    const sorted = [...page.latencies].sort((a, b) => a - b);
    const median = sorted[Math.floor((sorted.length - 1) / 2)];
    $("latency").textContent =
      `last answer ${(ms / 1000).toFixed(2)} s after you stopped speaking` +
      (sorted.length > 1
        ? ` · median ${(median / 1000).toFixed(2)} s over ${sorted.length} answers`
        : "");
  }
}

// Cumulative acknowledgements of what each answer has played so far (over
// WebRTC the server knows from its own track: the page sends none).
function sendAcks() {
  if (!page || !call || call.audioOnTracks) return;
  for (const answer of page.live) {
    if (answer.cut !== null) {
      if (!answer.finalAckSent) sendCut(answer);
      continue;
    }
    if (answer.playedMs > answer.ackedMs + 1 || (answer.fullyPlayed && !answer.finalAckSent)) {
      const played = Math.round(answer.playedMs * 10) / 10;
      if (call.send({ type: "playback.ack", response_id: answer.id, played_ms: played })) {
        answer.ackedMs = answer.playedMs;
        if (answer.fullyPlayed) {
          answer.finalAckSent = true;
          page.live.delete(answer);
        }
      }
    }
  }
}

function sendCut(answer) {
  const event = {
    type: "playback.ack",
    response_id: answer.id,
    played_ms: Math.round(answer.playedMs * 10) / 10,
  };
  if (page.capabilities.supports_audio_truncate) event.truncate = true;
  if (call.send(event)) {
    answer.finalAckSent = true;
    page.live.delete(answer);
  }
}

// Stop playing `answer` where it is: the page's record and the server's
// history both end at what was heard.
async function cut(answer, why) {
  if (answer.cutting || !audio) return; // the clear and the response.done both say so
  answer.cutting = true;
  // Over WebRTC the server has already emptied its track at the cut.
  const onTracks = call.audioOnTracks;
  const played = onTracks ? new Map([[answer.id, trackPlayedMs(answer)]]) : await audio.clear();
  if (!page) return;
  answer.cutAt(played.get(answer.id) || 0, why);
  page.interruptedUntil = performance.now() + INTERRUPTED_SHOWN_MS;
  if (page.current === answer) page.current = null;
  if (!onTracks) sendCut(answer);
  refreshState();
}

// Over WebRTC: how long `answer` has played, by the clock since the server
// said its audio started (output_audio_buffer.started; the network's and the
// browser's jitter buffer's delay are not counted).
function trackPlayedMs(answer) {
  return answer.startedAt === undefined ? 0 : performance.now() - answer.startedAt;
}

function trackClock() {
  const answer = page && page.current;
  if (!answer || answer.cut !== null || answer.fullyPlayed) return;
  if (answer.endsAt !== undefined && performance.now() >= answer.endsAt) {
    playedOut(answer); // the time it needed is up, though output_audio_buffer.stopped did not come
  } else if (answer.startedAt !== undefined) {
    answer.played(trackPlayedMs(answer));
  }
}

function playedOut(answer) {
  answer.trackStopped = true;
  answer.played(trackPlayedMs(answer));
  answer.audioFinished();
  answer.render();
  page.awaiting = false;
}

// The server's playback news, which only the WebRTC page heeds: its audio
// is on the track, so these say when it starts and ends.
function onTrackPlayback(event) {
  const answer = conversation.answers.get(event.response_id);
  if (!answer) return;
  if (event.type === "output_audio_buffer.started") {
    answer.startedAt = performance.now();
    onStarted(answer.id);
  } else if (event.type === "output_audio_buffer.stopped" && answer.cut === null) {
    playedOut(answer);
  }
}

function cutReason(response) {
  const duplex = response.duplex || {};
  if (duplex.reason === "server_restart") return "cut by a server restart";
  if (response.status === "failed") return "failed";
  return "interrupted";
}

function onEvent(event) {
  if (!page) return; // the call ended on this page; its last frames need nothing
  switch (event.type) {
    case "session.created": {
      $("session").textContent = event.session.id;
      const input = (event.session.audio && event.session.audio.input) || {};
      const detection = event.session.turn_detection || input.turn_detection; // GA: under audio
      if (detection && detection.silence_duration_ms) {
        page.silenceMs = detection.silence_duration_ms;
      }
      break;
    }
    case "input_audio_buffer.speech_started":
      page.userSpeaking = true;
      conversation.user(event.item_id);
      break;
    case "input_audio_buffer.speech_stopped": {
      page.userSpeaking = false;
      page.awaiting = true; // unless the server drops it (input_audio_buffer.cleared)
      const arrived = performance.now();
      page.speechEnd = page.wallAt(event.audio_end_ms, arrived - page.silenceMs);
      break;
    }
    case "input_audio_buffer.cleared":
      // Speech that was not taken as a turn (a short remark over an answer).
      page.userSpeaking = false;
      page.awaiting = false;
      for (const [id, turn] of conversation.users) {
        if (turn.node.classList.contains("partial")) {
          turn.dropped();
          conversation.users.delete(id);
        }
      }
      break;
    case "conversation.item.input_audio_transcription.delta":
      conversation.user(event.item_id).partial(event.delta || "");
      break;
    case "conversation.item.input_audio_transcription.completed":
      conversation.user(event.item_id).final(event.transcript);
      break;
    case "input_audio_buffer.committed":
      page.awaiting = true;
      break;
    case "response.created": {
      const answer = conversation.answer(event.response.id);
      answer.speechEnd = page.speechEnd;
      page.speechEnd = null;
      page.current = answer;
      page.live.add(answer);
      if (call.audioOnTracks) answer.playsElsewhere();
      break;
    }
    case "response.output_audio.delta": {
      const answer = conversation.answer(event.response_id);
      const meta = event.metadata || {};
      const rate = event.sample_rate_hz || 24000;
      // The audio came in its binary frame (call.js), else as base64.
      const bytes = event.audio ? event.audio.byteLength : (event.delta.length * 3) / 4;
      const duration = meta.audio_duration_ms ?? (bytes / 2 / rate) * 1000;
      answer.audio(duration, meta.audio_text_marks);
      if (answer.cut === null) {
        if (event.audio) audio.playPcm(event.response_id, event.audio, rate);
        else audio.play(event.response_id, event.delta, rate);
      }
      break;
    }
    case "response.output_audio_transcript.delta": {
      const answer = conversation.answer(event.response_id);
      answer.spoken = true; // over WebRTC, a spoken answer plays on after its response.done
      answer.text(event.delta || "");
      break;
    }
    case "response.output_text.delta":
      conversation.answer(event.response_id).text(event.delta || "");
      break;
    case "output_audio_buffer.started":
    case "output_audio_buffer.stopped":
      if (call.audioOnTracks) onTrackPlayback(event);
      break;
    case "response.output_audio.done":
      // Its tail may be shorter than the jitter buffer: play it now. (The
      // answer's length is known only if it completes: a cut one stopped early.)
      audio.ended();
      break;
    case "output_audio_buffer.cleared": {
      const answer = conversation.answers.get(event.response_id);
      if (answer) cut(answer, "interrupted");
      break;
    }
    case "response.done": {
      const response = event.response;
      const answer = conversation.answer(response.id);
      const playback = (response.duplex || {}).playback;
      if (call.audioOnTracks && response.status === "completed" && answer.spoken && playback) {
        // Its audio may still be playing on the track: output_audio_buffer.stopped
        // ends it, or the clock once what the server had yet to send has played.
        if (!answer.trackStopped) {
          answer.endsAt = performance.now() + playback.generated_ms - playback.played_ms;
          break;
        }
      }
      page.awaiting = false;
      if (response.status === "completed") {
        answer.audioFinished();
        answer.render();
      } else {
        cut(answer, cutReason(response));
      }
      break;
    }
    case "session.resync_required":
      say("notice", "Part of the conversation could not be replayed after the reconnect.");
      break;
    case "session.replaced":
      finish("This conversation was taken over by another window.");
      break;
    case "session.expired":
      finish(`The session expired (${event.reason}). Press Start for a new conversation.`);
      break;
    case "session.closed":
      if (event.reason !== "client_close") finish(`The session ended (${event.reason}).`);
      break;
    case "error":
      onServerError(event.error || {});
      break;
    default:
  }
  refreshState();
}

function onServerError(error) {
  // A late acknowledgement for an answer the server has moved past, or a
  // cancel that arrived after the answer ended (OpenAI's harmless code).
  if (error.code === "response_not_found") return;
  if (error.code === "response_cancel_not_active") return;
  if (error.code === "rate_limited") {
    say("server", "The server is busy: some of your audio was not taken.");
    return;
  }
  say("server", `The server said: ${error.message || error.code} (${error.code})`);
}

function onLink(kind, detail) {
  if (!page) return;
  if (kind === "open") {
    page.link = "open";
    $("session").textContent = detail.sessionId;
    say("notice", "");
  } else if (kind === "reconnecting") {
    page.link = "reconnecting";
    page.userSpeaking = false;
    say(
      "notice",
      `Connection lost. Reconnecting to the same session (try ${detail.attempt} of ${detail.of})…`,
    );
  } else if (kind === "resumed") {
    page.link = "open";
    $("session").textContent = detail.sessionId;
    const seconds = (detail.afterMs / 1000).toFixed(1);
    say(
      "notice",
      `Reconnected after ${seconds} s: the same session (${detail.sessionId}) resumed.`,
    );
    conversation.note(`reconnected after ${seconds} s, same session`);
  } else if (kind === "ended") {
    finish(detail.message);
    return;
  }
  refreshState();
}

// ---- start and stop -----------------------------------------------------

function settings() {
  const session = { turn_detection: { type: "server_vad" } };
  const model = $("model").value;
  if (model) session.model = model;
  const voice = $("voice").value;
  if (voice) session.voice = voice;
  const instructions = $("instructions").value.trim();
  if (instructions) session.instructions = instructions;
  return session;
}

function remember() {
  localStorage.setItem("duplex.model", $("model").value);
  localStorage.setItem("duplex.voice", $("voice").value);
  localStorage.setItem("duplex.instructions", $("instructions").value);
  localStorage.setItem("duplex.transport", $("transport").value);
}

// The call over the chosen transport: "auto" is WebRTC where this browser
// and the server can carry it, else the WebSocket. Resolves once it is open.
async function connect(choice) {
  const options = {
    key: $("key").value.trim(),
    settings: settings(),
    onEvent,
    onLink,
    microphone: audio.stream,
  };
  let why = "";
  if (choice !== "websocket") {
    call = new RtcCall(options);
    try {
      await call.start();
      showTransport("WebRTC");
      return;
    } catch (err) {
      if (!(err instanceof Unavailable) || choice === "webrtc") throw err;
      why = err.message;
    }
  }
  call = new Call(options);
  await call.start();
  showTransport("WebSocket", why);
}

function showTransport(name, why) {
  $("transport-used").textContent = why ? `${name} (WebRTC unavailable: ${why})` : name;
}

// During a call the settings are fixed and folded away (a phone's screen is
// for the conversation); the summary line still says what was chosen.
function lockSettings(locked) {
  for (const id of ["model", "voice", "instructions", "key", "transport"]) {
    $(id).disabled = locked;
  }
  $("settings").open = !locked;
  const voice = $("voice").value || "default voice";
  $("summary").textContent = locked ? `· ${$("model").value} · ${voice}` : "";
}

async function start() {
  const model = selectedModel();
  if (!model) {
    await loadModels();
    if (!selectedModel()) return;
  }
  const problem = unfitMessage(selectedModel());
  if (problem) {
    say("alert", problem);
    return;
  }
  remember();
  say("alert", "");
  say("notice", "");
  say("server", "");
  $("start").disabled = true;
  lockSettings(true);
  conversation.clear();
  $("session").textContent = "none";
  $("latency").textContent = "no answer yet";
  $("transport-used").textContent = "connecting";
  page = new PageCall(selectedModel().capabilities || {});
  showState("connecting");
  audio = new AudioIO({ onChunk, onLevel: setLevel, onStarted, onPlayed });
  try {
    await audio.open();
    await connect($("transport").value);
  } catch (err) {
    if (err instanceof Unavailable) {
      finish(`WebRTC cannot carry this call: ${err.message}. Choose another connection above.`);
      return;
    }
    if (err instanceof MicrophoneError || err instanceof Fatal) {
      finish(err.message);
      return;
    }
    finish(`Something went wrong starting the call: ${err.message || err}`);
    throw err;
  }
  page.timers = [setInterval(sendAcks, ACK_EVERY_MS), setInterval(refreshState, 100)];
  if (call.audioOnTracks) page.timers.push(setInterval(trackClock, 100));
  $("stop").disabled = false;
}

// Ends the call on this page; `message` (if any) says why, as an alert.
function finish(message) {
  if (call) call.stop();
  if (audio) audio.close();
  if (page && page.timers) for (const timer of page.timers) clearInterval(timer);
  call = null;
  audio = null;
  page = null;
  setLevel(0);
  showState(message ? "ended" : "idle");
  if (message) say("alert", message);
  lockSettings(false);
  $("stop").disabled = true;
  const model = selectedModel();
  $("start").disabled = !model || Boolean(unfitMessage(model));
}

$("start").addEventListener("click", () => start());
// Enter in a settings field starts the call (if it can start).
$("setup").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!$("start").disabled) start();
});
$("stop").addEventListener("click", () => {
  sendAcks();
  finish("");
  say("notice", "Call ended.");
});
$("model").addEventListener("change", showModel);
$("voice").value = localStorage.getItem("duplex.voice") || "";
$("instructions").value = localStorage.getItem("duplex.instructions") || "";
// ?transport=webrtc|websocket|auto wins over the remembered choice.
const asked = new URLSearchParams(location.search).get("transport");
const transport = TRANSPORTS.includes(asked) ? asked : localStorage.getItem("duplex.transport");
$("transport").value = TRANSPORTS.includes(transport) ? transport : "auto";
loadModels();
