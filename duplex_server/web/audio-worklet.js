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
// not become audible gaps. Reports how many samples were played.
class Player extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.jitter = options.processorOptions.jitterSamples;
    this.queue = [];
    this.offset = 0;
    this.buffered = 0;
    this.playing = false;
    this.played = 0;
    this.sinceReport = 0;
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.type === "push") {
        this.queue.push(message.samples);
        this.buffered += message.samples.length;
      } else if (message.type === "clear") {
        this.queue = [];
        this.offset = 0;
        this.buffered = 0;
        this.playing = false;
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
        const count = Math.min(out.length - written, head.length - this.offset);
        out.set(head.subarray(this.offset, this.offset + count), written);
        written += count;
        this.offset += count;
        this.buffered -= count;
        if (this.offset >= head.length) {
          this.queue.shift();
          this.offset = 0;
        }
      }
      if (written < out.length) this.playing = false; // drained: rebuffer before resuming
    }
    out.fill(0, written);
    this.played += written;
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) {
      this.sinceReport = 0;
      this.port.postMessage({ played: this.played, buffered: this.buffered });
    }
    return true;
  }
}

registerProcessor("capture", Capture);
registerProcessor("player", Player);
