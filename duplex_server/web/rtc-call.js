// One conversation over WebRTC, as OpenAI's browser guide has it: an offer
// posted to /v1/realtime/calls (every candidate gathered, no trickle), the
// microphone on an Opus track, the answer on the server's track, and the
// events on the data channel `oai-events`. That channel is OpenAI's
// endpoint (OpenAI's semantics): no audio deltas come on it, and the server
// acknowledges playback from its own track, so the page sends no acks.
//
// The same interface as Call (call.js), whose reconnect loop it shares: a
// peer connection that fails or falls silent is replaced by a new offer
// naming the session, its resume token and the last server_event_seq seen
// (query parameters, PROTOCOL.md); the server answers session.resumed on
// the new channel and replays what was missed.

import {
  Call,
  EVENT_ACK_MS,
  Fatal,
  Retryable,
  SILENT_LIMIT_MS,
  errorText,
  mintSecret,
} from "./call.js";

const CALLS_PATH = "/v1/realtime/calls";
const CHANNEL_LABEL = "oai-events";
const GATHER_MS = 2000; // the candidates gathered by then go in the offer
const POST_TIMEOUT_MS = 8000;
// ICE and DTLS up and the session's first event on the channel, or no call.
const CONNECT_TIMEOUT_MS = 10000;
// ICE "disconnected" this long (the server's packets stopped): resume anew.
const DISCONNECTED_LIMIT_MS = 3000;
const CLOSE_GRACE_MS = 300; // time for session.close to leave before the connection goes
// OpenAI's endpoint says what it heard only to a session that asks for a transcription.
const TRANSCRIPTION = { model: "gpt-4o-transcribe" };
// Refusals of an offer that say this browser's offer, not the call, is the problem.
const OFFER_CODES = ["invalid_offer", "unsupported_codec", "unsupported_content_type"];

// WebRTC cannot carry this call (no RTCPeerConnection here, no WebRTC on the
// server, no media path between them); the WebSocket may. Fatal where the
// person asked for WebRTC only.
export class Unavailable extends Fatal {}

export class RtcCall extends Call {
  // As Call's, and microphone: the MediaStream whose audio track is sent.
  constructor({ key, settings, onEvent, onLink, microphone }) {
    super({ key, settings, onEvent, onLink });
    this.transport = "WebRTC";
    this.audioOnTracks = true; // the microphone and the answer ride the peer connection
    this.microphone = microphone;
    this.speaker = new Audio();
    this.speaker.autoplay = true;
    this.pc = null;
    this.channel = null;
    this.disconnectedSince = null;
  }

  get attached() {
    return this.channel !== null && this.channel.readyState === "open";
  }

  async start() {
    if (typeof RTCPeerConnection !== "function") {
      throw new Unavailable("this browser has no WebRTC (RTCPeerConnection)");
    }
    await super.start();
  }

  send(event) {
    if (!this.attached) return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  stop() {
    this.stopped = true;
    for (const timer of this.timers) clearInterval(timer);
    if (this.attached) this.send({ type: "session.close" });
    this.detach(CLOSE_GRACE_MS);
    this.speaker.srcObject = null;
  }

  end(message) {
    this.detach();
    this.speaker.srcObject = null;
    super.end(message);
  }

  // A peer connection and either a new session (the settings beside the
  // offer, OpenAI's multipart form) or, with resume, the old one; resolves
  // once the session's first event arrived on the channel.
  async attach(resume) {
    const secret = await mintSecret(this.key);
    const pc = new RTCPeerConnection();
    const channel = pc.createDataChannel(CHANNEL_LABEL);
    for (const track of this.microphone.getAudioTracks()) pc.addTrack(track, this.microphone);
    pc.ontrack = (event) => {
      this.speaker.srcObject = event.streams[0] || new MediaStream([event.track]);
      this.speaker.play().catch(() => {}); // autoplay: Start was the gesture
    };
    this.detach();
    this.pc = pc;
    this.channel = channel;
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      const sdp = await this.post(pc.localDescription.sdp, secret, resume);
      await pc.setRemoteDescription({ type: "answer", sdp });
      await this.opened(pc, channel, resume);
    } catch (err) {
      if (this.pc === pc) this.detach();
      throw err;
    }
    this.disconnectedSince = null;
    pc.onconnectionstatechange = () => this.connectionChanged(pc);
    channel.onclose = () => {
      if (this.pc === pc) this.dropped();
    };
  }

  // POST /v1/realtime/calls; the answer's SDP, or why there is none.
  async post(sdp, secret, resume) {
    const headers = { Authorization: `Bearer ${secret}` };
    let url = CALLS_PATH;
    let body;
    if (resume) {
      const named = new URLSearchParams({
        session_id: this.sessionId,
        resume_token: this.resumeToken,
        last_received_server_event_seq: String(this.lastSeq),
      });
      url += `?${named}`;
      headers["Content-Type"] = "application/sdp";
      body = sdp;
    } else {
      body = new FormData();
      body.append("sdp", sdp);
      const session = { input_audio_transcription: TRANSCRIPTION, ...this.settings };
      body.append("session", JSON.stringify(session));
    }
    let response;
    try {
      response = await fetch(url, {
        method: "POST",
        headers,
        body,
        cache: "no-store",
        signal: AbortSignal.timeout(POST_TIMEOUT_MS),
      });
    } catch {
      throw new Retryable("the server did not answer");
    }
    if (response.status === 201) return response.text();
    const error = (await response.json().catch(() => ({}))).error || {};
    const status = response.status;
    if (status >= 500 || status === 429) {
      throw new Retryable(`the server answered HTTP ${status}`);
    }
    const what = resume ? "resume the conversation" : "start the conversation";
    if (!resume && (status === 404 || status === 405 || status === 501)) {
      throw new Unavailable(`the server does not offer WebRTC (HTTP ${status})`);
    }
    if (!resume && (OFFER_CODES.includes(error.code) || status === 415)) {
      const why = errorText(error);
      throw new Unavailable(`the server could not answer this browser's offer: ${why}`);
    }
    throw new Fatal(`The server would not ${what}: ${errorText(error)}`);
  }

  // Resolves at the session's first event on the channel (session.created,
  // or session.resumed); a connection that does not get there in time fails.
  opened(pc, channel, resume) {
    return new Promise((resolve, reject) => {
      let attached = false;
      const fail = (err) => {
        clearTimeout(timer);
        channel.onmessage = null;
        channel.onclose = null;
        pc.onconnectionstatechange = null;
        reject(err);
      };
      // No media path (UDP blocked, no usable candidate): the WebSocket may
      // still get through at the start; on a resume it is one failed try.
      const noPath = (why) =>
        resume
          ? new Retryable(why)
          : new Unavailable(`no WebRTC connection to the server (${why})`);
      const timer = setTimeout(
        () => fail(noPath(`not connected within ${CONNECT_TIMEOUT_MS / 1000} s`)),
        CONNECT_TIMEOUT_MS,
      );
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed") fail(noPath("ICE failed"));
      };
      channel.onclose = () => fail(noPath("the data channel closed"));
      channel.onmessage = (message) => {
        this.lastHeard = performance.now();
        const event = JSON.parse(message.data);
        if (!attached) {
          const opened = this.opening(event, resume);
          if (opened === true) {
            attached = true;
            clearTimeout(timer);
            resolve();
          } else if (opened) {
            fail(opened);
            return;
          }
        }
        this.receive(event);
      };
    });
  }

  connectionChanged(pc) {
    if (this.pc !== pc) return;
    const state = pc.connectionState;
    if (state === "failed" || state === "closed") {
      this.dropped();
    } else if (state === "disconnected") {
      this.disconnectedSince ??= performance.now();
    } else {
      this.disconnectedSince = null;
    }
  }

  tick() {
    if (!this.attached) return;
    const now = performance.now();
    const disconnected =
      this.disconnectedSince !== null && now - this.disconnectedSince > DISCONNECTED_LIMIT_MS;
    if (disconnected || now - this.lastHeard > SILENT_LIMIT_MS) {
      this.dropped(); // it closes this connection and offers a new one
      return;
    }
    // Acknowledged events leave the server's replay journal.
    if (this.lastSeq > this.ackedSeq && now - (this.lastEventAck || 0) >= EVENT_ACK_MS) {
      this.send({ type: "session.event_ack", server_event_seq: this.lastSeq });
      this.ackedSeq = this.lastSeq;
      this.lastEventAck = now;
    }
  }

  // The connection is given up: closed now, or after `graceMs`.
  detach(graceMs = 0) {
    const { pc, channel } = this;
    this.pc = null;
    this.channel = null;
    this.disconnectedSince = null;
    if (channel) {
      channel.onmessage = null;
      channel.onclose = null;
    }
    if (!pc) return;
    pc.onconnectionstatechange = null;
    pc.ontrack = null;
    if (graceMs) setTimeout(() => pc.close(), graceMs);
    else pc.close();
  }
}

// Resolves when every candidate is gathered, or after GATHER_MS with those there are.
function gathered(pc) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") {
      resolve();
      return;
    }
    const timer = setTimeout(done, GATHER_MS);
    function done() {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    }
    function check() {
      if (pc.iceGatheringState === "complete") done();
    }
    pc.addEventListener("icegatheringstatechange", check);
  });
}
