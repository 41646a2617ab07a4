// The audio thread's half of the page: the microphone tap and the player.

// Capture: hands each 128-sample block of microphone audio to the page.
class Capture extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}

// Player with a jitter buffer: playback starts (and restarts after an
// underrun) only once `jitter` samples are queued, so network jitter does
// not become audible gaps. It counts the samples it played of each response
// (the page acknowledges exactly those), says at once when a response's
// first sample plays (the page's latency figure), and on "clear" answers
// with what was played when the queue was dropped (the truncation point).
class Player extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.jitter = options.processorOptions.jitterSamples;
    this.queue = []; // {id, samples}
    this.offset = 0;
    this.buffered = 0;
    this.playing = false;
    this.played = new Map(); // response id -> samples played
    this.sinceReport = 0;
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.type === "push") {
        this.queue.push({ id: message.id, samples: message.samples });
        this.buffered += message.samples.length;
      } else if (message.type === "end") {
        // The answer's last audio is queued: play it even if it is shorter
        // than the jitter buffer.
        if (this.buffered > 0) this.playing = true;
      } else if (message.type === "clear") {
        this.queue = [];
        this.offset = 0;
        this.buffered = 0;
        this.playing = false;
        this.port.postMessage({ type: "cleared", played: Object.fromEntries(this.played) });
      }
    };
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let written = 0;
    if (!this.playing && this.buffered >= this.jitter) this.playing = true;
    if (this.playing) {
      while (written < out.length && this.queue.length) {
        const head = this.queue[0];
        const count = Math.min(out.length - written, head.samples.length - this.offset);
        out.set(head.samples.subarray(this.offset, this.offset + count), written);
        written += count;
        this.offset += count;
        this.buffered -= count;
        const before = this.played.get(head.id) || 0;
        this.played.set(head.id, before + count);
        if (before === 0) this.port.postMessage({ type: "started", id: head.id });
        if (this.offset >= head.samples.length) {
          this.queue.shift();
          this.offset = 0;
        }
      }
      if (written < out.length) {
        this.playing = false; // drained: rebuffer before resuming
        this.report();
      }
    }
    out.fill(0, written);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) this.report();
    return true;
  }

  report() {
    this.sinceReport = 0;
    this.port.postMessage({ type: "played", played: Object.fromEntries(this.played) });
    // Keep the map small: only responses still queued or just played matter.
    if (this.played.size > 8) {
      const keep = new Set(this.queue.map((chunk) => chunk.id));
      for (const id of this.played.keys()) {
        if (this.played.size <= 4) break;
        if (!keep.has(id)) this.played.delete(id);
      }
    }
  }
}

registerProcessor("capture", Capture);
registerProcessor("player", Player);
