// One conversation with the server: a client secret, a socket, the session
// it opens, and the same session resumed on a new socket when the network
// or the server drops (PROTOCOL.md: session.resume with the resume token and
// the last server_event_seq seen; the server replays what was missed).

export const HEARTBEAT_MS = 4000;
// No frame (not even a heartbeat ack) this long: the link is dead.
export const SILENT_LIMIT_MS = 10000;
// A try that hangs (a network that swallows packets) is a failed try.
const MINT_TIMEOUT_MS = 5000;
const ATTACH_TIMEOUT_MS = 8000;
export const EVENT_ACK_MS = 2000;
// Waits before each reconnect try; their number bounds how long the page
// keeps trying (about 20 s, inside the server's 30 s disconnect grace).
export const RETRY_DELAYS_MS = [250, 750, 1500, 2500, 4000, 5000, 6000];

// Binary audio (?audio=binary, PROTOCOL.md "Binary audio"): each frame is a
// 24-byte little-endian header, then the raw audio. The microphone goes up
// as input frames; each answer delta arrives as its event (delta "") and,
// right after it, the frame with its audio.
const FRAME_MAGIC = 0xda;
const FRAME_VERSION = 1;
const FRAME_INPUT = 1;
const FRAME_OUTPUT = 2;
const FRAME_HEADER_BYTES = 24;
const FORMAT_PCM16 = 1;
const AUDIO_DELTAS = new Set(["response.output_audio.delta", "response.audio.delta"]);

// An input frame: pcm16 samples at rate, sequence seq (its event_id is audio_<seq>).
export function inputFrame(int16, rate, seq) {
  const frame = new ArrayBuffer(FRAME_HEADER_BYTES + int16.byteLength);
  const head = new DataView(frame);
  head.setUint8(0, FRAME_MAGIC);
  head.setUint8(1, FRAME_VERSION);
  head.setUint8(2, FRAME_INPUT);
  head.setUint8(3, FORMAT_PCM16);
  head.setUint32(8, rate, true);
  head.setUint32(12, Math.round((int16.length * 1e6) / rate), true);
  head.setBigUint64(16, BigInt(seq), true);
  new Uint8Array(frame, FRAME_HEADER_BYTES).set(
    new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength),
  );
  return frame;
}

// An output frame's sequence (the server_event_seq of its delta) and audio; null if it is none.
export function readFrame(buffer) {
  if (buffer.byteLength < FRAME_HEADER_BYTES) return null;
  const head = new DataView(buffer);
  if (head.getUint8(0) !== FRAME_MAGIC || head.getUint8(1) !== FRAME_VERSION) return null;
  if (head.getUint8(2) !== FRAME_OUTPUT) return null;
  return {
    seq: Number(head.getBigUint64(16, true)),
    rate: head.getUint32(8, true),
    audio: new Uint8Array(buffer, FRAME_HEADER_BYTES),
  };
}

// A failure a person must act on (wrong key, refused settings, session gone).
export class Fatal extends Error {}
// A failure that another try may get past (server restarting, network down).
export class Retryable extends Error {}

export function errorText(error) {
  const code = error && error.code ? ` (${error.code})` : "";
  return `${(error && error.message) || "unknown error"}${code}`;
}

// Trades the user's key (or none, on a server without keys) for a client
// secret, good for one socket or one WebRTC offer.
export async function mintSecret(key) {
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  let response;
  try {
    response = await fetch("/v1/realtime/client_secrets", {
      method: "POST",
      headers,
      body: "{}",
      cache: "no-store",
      signal: AbortSignal.timeout(MINT_TIMEOUT_MS),
    });
  } catch {
    throw new Retryable("the server did not answer");
  }
  if (response.status === 401) {
    throw new Fatal(
      key
        ? "The server refused this API key. Check the key and press Start again."
        : "This server needs an API key. Enter it above and press Start again.",
    );
  }
  if (response.status === 403) {
    throw new Fatal("This API key may not open voice sessions (it lacks the realtime scope).");
  }
  if (response.status >= 500 || response.status === 429) {
    throw new Retryable(`the server answered HTTP ${response.status}`);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Fatal(`The server refused to start a session: ${errorText(body.error)}`);
  return body.value;
}

export class Call {
  // settings: the opening session.update's session object.
  // onEvent(event): every server event, once, in order (replays deduplicated).
  // onLink(kind, detail): "open", "reconnecting", "resumed", "ended".
  // (RtcCall in rtc-call.js is the same interface over WebRTC.)
  constructor({ key, settings, onEvent, onLink }) {
    this.transport = "WebSocket";
    this.audioOnTracks = false; // the page sends its microphone, plays and acknowledges the answer
    this.key = key;
    this.settings = settings;
    this.onEvent = onEvent;
    this.onLink = onLink;
    this.socket = null;
    this.sessionId = null;
    this.resumeToken = null;
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.lastHeard = 0;
    this.stopped = false;
    this.timers = [];
    this.audioSeq = 0; // input frames sent: each one's sequence
    this.heldDelta = null; // an answer delta waiting for its audio frame
  }

  get attached() {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  async start() {
    try {
      await this.attach(false);
    } catch (err) {
      if (err instanceof Fatal) throw err;
      throw new Fatal(`Could not reach the server (${err.message}). Is it running?`);
    }
    this.timers.push(setInterval(() => this.tick(), 1000));
    this.timers.push(setInterval(() => this.send({ type: "session.heartbeat" }), HEARTBEAT_MS));
    this.onLink("open", { sessionId: this.sessionId });
  }

  // Sends one client event; false when there is no socket to send it on.
  send(event) {
    if (!this.attached) return false;
    this.socket.send(JSON.stringify(event));
    return true;
  }

  // Sends microphone audio (pcm16 at rate) as one binary input frame: the
  // server logs it as the input_audio_buffer.append it stands for.
  sendAudio(int16, rate) {
    if (!this.attached) return false;
    this.audioSeq += 1;
    this.socket.send(inputFrame(int16, rate, this.audioSeq));
    return true;
  }

  stop() {
    this.stopped = true;
    for (const timer of this.timers) clearInterval(timer);
    if (this.attached) this.send({ type: "session.close" });
    if (this.socket) {
      this.socket.onclose = null;
      this.socket.close();
    }
  }

  // Opens a socket and either a new session or, with resume, the old one;
  // resolves once the session is attached.
  async attach(resume) {
    // A client secret opens the socket: the key never rides in a subprotocol.
    const secret = await mintSecret(this.key);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/v1/realtime?duplex=1&autostart=0&audio=binary`;
    const socket = new WebSocket(url, ["realtime", `openai-insecure-api-key.${secret}`]);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    this.heldDelta = null;
    await new Promise((resolve, reject) => {
      let attached = false;
      const timer = setTimeout(() => {
        socket.onclose = null;
        socket.onmessage = null;
        socket.close();
        reject(new Retryable("the server did not answer in time"));
      }, ATTACH_TIMEOUT_MS);
      socket.onopen = () => {
        this.lastHeard = performance.now();
        if (resume) {
          socket.send(
            JSON.stringify({
              type: "session.resume",
              session_id: this.sessionId,
              resume_token: this.resumeToken,
              last_received_server_event_seq: this.lastSeq,
            }),
          );
        } else {
          socket.send(JSON.stringify({ type: "session.update", session: this.settings }));
        }
      };
      socket.onmessage = (message) => {
        this.lastHeard = performance.now();
        if (typeof message.data !== "string") {
          this.receiveAudio(message.data);
          return;
        }
        const event = JSON.parse(message.data);
        if (!attached) {
          const opened = this.opening(event, resume);
          if (opened === true) {
            attached = true;
            clearTimeout(timer);
            resolve();
          } else if (opened) {
            clearTimeout(timer);
            socket.onclose = null;
            socket.close();
            reject(opened);
            return;
          }
        }
        this.receive(event);
      };
      socket.onclose = () => {
        if (!attached) {
          clearTimeout(timer);
          reject(new Retryable("the connection closed before the session opened"));
        } else if (this.socket === socket) {
          this.dropped();
        }
      };
    });
  }

  // What an event before the session is attached means: true when it is
  // the session's first (created, or resumed: its id and token are kept),
  // the error to fail with when it is a refusal, null for anything else.
  opening(event, resume) {
    if (event.type === "session.created" || event.type === "session.resumed") {
      this.sessionId = event.session ? event.session.id : this.sessionId;
      this.resumeToken = event.resume_token;
      return true;
    }
    if (event.type !== "error") return null;
    const error = event.error || {};
    const again = error.type === "server_error" || error.type === "rate_limit_error";
    const what = resume ? "resume the conversation" : "start the conversation";
    return again
      ? new Retryable(errorText(error))
      : new Fatal(`The server would not ${what}: ${errorText(error)}`);
  }

  // An answer's audio frame: the delta event just before it, whole.
  receiveAudio(buffer) {
    const frame = readFrame(buffer);
    const held = this.heldDelta;
    this.heldDelta = null;
    if (frame === null || held === null || held.server_event_seq !== frame.seq) return;
    held.audio = frame.audio; // the delta's pcm16, in place of base64
    this.deliver(held);
  }

  receive(event) {
    if (AUDIO_DELTAS.has(event.type) && event.delta === "") {
      this.heldDelta = event; // its audio is the next frame
      return;
    }
    this.deliver(event);
  }

  deliver(event) {
    const seq = event.server_event_seq;
    if (seq !== null && seq !== undefined) {
      if (seq <= this.lastSeq) return; // replayed twice: already handled
      this.lastSeq = seq;
    }
    if (event.type === "session.resumed") this.resumeToken = event.resume_token;
    this.onEvent(event);
  }

  tick() {
    if (!this.attached) return;
    if (performance.now() - this.lastHeard > SILENT_LIMIT_MS) {
      // Nothing heard for too long (heartbeats included): the link is dead
      // even if no close came. Drop it and resume on a new one.
      const socket = this.socket;
      socket.onclose = null;
      socket.onmessage = null;
      socket.close();
      this.dropped();
      return;
    }
    // Acknowledged events leave the server's replay journal.
    const now = performance.now();
    if (this.lastSeq > this.ackedSeq && now - (this.lastEventAck || 0) >= EVENT_ACK_MS) {
      this.send({ type: "session.event_ack", server_event_seq: this.lastSeq });
      this.ackedSeq = this.lastSeq;
      this.lastEventAck = now;
    }
  }

  // The socket is gone while the session lives: resume it on a new one,
  // a bounded number of times.
  async dropped() {
    if (this.stopped || this.reconnecting) return;
    this.reconnecting = true;
    this.detach();
    const since = performance.now();
    let reason = "";
    for (let attempt = 1; attempt <= RETRY_DELAYS_MS.length; attempt++) {
      this.onLink("reconnecting", { attempt, of: RETRY_DELAYS_MS.length, reason });
      await new Promise((resolve) => setTimeout(resolve, RETRY_DELAYS_MS[attempt - 1]));
      if (this.stopped) return;
      try {
        await this.attach(true);
        this.reconnecting = false;
        this.onLink("resumed", {
          sessionId: this.sessionId,
          afterMs: performance.now() - since,
          attempts: attempt,
        });
        return;
      } catch (err) {
        if (err instanceof Fatal) {
          this.reconnecting = false;
          this.end(err.message);
          return;
        }
        reason = err.message;
      }
    }
    this.reconnecting = false;
    const seconds = ((performance.now() - since) / 1000).toFixed(0);
    this.end(
      `The server did not come back: ${RETRY_DELAYS_MS.length} tries to reconnect in ` +
        `${seconds} s failed (${reason}). The conversation has ended; press Start for a new one.`,
    );
  }

  // The link is gone (its close already came, or it was closed for silence).
  detach() {
    this.socket = null;
  }

  // The session is over for this page (said by the server or given up).
  end(message) {
    this.stopped = true;
    for (const timer of this.timers) clearInterval(timer);
    if (this.socket) {
      this.socket.onclose = null;
      this.socket.close();
    }
    this.onLink("ended", { message });
  }
}
