// The conversation as a person sees it: what they said (partial while they
// speak), and what the assistant said as far as it was heard, cut where a
// barge-in cut it.

// Speech pace used only until an answer's clause has all arrived: about
// eSpeak's and most voices' 14 characters a second.
const MS_PER_CHAR = 60;

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export class Conversation {
  constructor(list) {
    this.list = list;
    this.users = new Map(); // item id -> UserTurn
    this.answers = new Map(); // response id -> Answer
  }

  clear() {
    this.list.replaceChildren();
    this.users.clear();
    this.answers.clear();
  }

  add(node) {
    this.list.appendChild(node);
    node.scrollIntoView({ block: "end", behavior: "smooth" });
  }

  user(itemId) {
    let turn = this.users.get(itemId);
    if (!turn) {
      turn = new UserTurn();
      this.users.set(itemId, turn);
      this.add(turn.node);
    }
    return turn;
  }

  answer(responseId) {
    let answer = this.answers.get(responseId);
    if (!answer) {
      answer = new Answer(responseId);
      this.answers.set(responseId, answer);
      this.add(answer.node);
    }
    return answer;
  }

  note(text) {
    this.add(element("li", "note", text));
  }
}

class UserTurn {
  constructor() {
    this.node = element("li", "turn user partial");
    this.node.append(element("span", "who", "You"));
    this.text = element("p", "text", "…");
    this.node.append(this.text);
    this.heard = "";
  }

  partial(delta) {
    this.heard += delta;
    this.text.textContent = `${this.heard}…`;
  }

  final(transcript) {
    this.node.classList.remove("partial");
    this.text.textContent = transcript || "(nothing recognised)";
  }

  // The server did not take it as a turn (a short remark over an answer).
  dropped() {
    this.node.remove();
  }
}

// One assistant answer. Its text is shown as its audio plays: each clause's
// characters are spread over that clause's audio (the audio-text marks on
// each audio delta say which characters a chunk carries).
export class Answer {
  constructor(responseId) {
    this.id = responseId;
    this.node = element("li", "turn assistant");
    this.node.dataset.responseId = responseId;
    this.node.append(element("span", "who", "Assistant"));
    this.textNode = element("p", "text", "…");
    this.node.append(this.textNode);
    this.foot = element("div", "foot");
    this.node.append(this.foot);
    this.fullText = "";
    this.spans = []; // {startMs, endMs|null, from, to}: characters [from, to) over audio
    this.receivedMs = 0;
    this.playedMs = 0;
    this.audioDone = false;
    this.hasAudio = false;
    this.started = false; // its first sample has played
    this.cut = null; // why it was cut, once it was
    this.clocked = false; // its played time is the clock's, not counted samples
    this.ackedMs = 0;
    this.finalAckSent = false;
  }

  audio(durationMs, marks) {
    this.hasAudio = true;
    const start = this.receivedMs;
    this.receivedMs += durationMs;
    const chars = marks && marks.length ? marks.at(-1).text_chars : this.fullText.length;
    const last = this.spans.at(-1);
    if (!last || chars > last.to) {
      if (last) last.endMs = start;
      this.spans.push({ startMs: start, endMs: null, from: last ? last.to : 0, to: chars });
    }
  }

  text(delta) {
    this.fullText += delta;
    if (this.clocked) this.spans = [{ startMs: 0, endMs: null, from: 0, to: this.fullText.length }];
    this.render();
  }

  // Its audio plays where the page cannot count it (a WebRTC track): its
  // words are spread at speech pace over the time since it started playing.
  playsElsewhere() {
    this.hasAudio = true;
    this.clocked = true;
    this.text("");
  }

  audioFinished() {
    this.audioDone = true;
    const last = this.spans.at(-1);
    if (last) last.endMs = this.receivedMs;
  }

  played(ms) {
    if (this.cut !== null) return;
    this.playedMs = Math.max(this.playedMs, ms);
    this.render();
  }

  get fullyPlayed() {
    return this.audioDone && this.playedMs >= this.receivedMs - 1;
  }

  // How many characters were spoken by `ms` of audio.
  spokenChars(ms) {
    let chars = 0;
    for (const span of this.spans) {
      if (ms <= span.startMs) break;
      const guess = span.startMs + (span.to - span.from) * MS_PER_CHAR;
      const end = span.endMs ?? Math.max(guess, this.receivedMs);
      const share = end > span.startMs ? Math.min(1, (ms - span.startMs) / (end - span.startMs)) : 1;
      chars = span.from + Math.round((span.to - span.from) * share);
    }
    return Math.min(chars, this.fullText.length);
  }

  shown() {
    if (!this.hasAudio) return this.fullText; // a text answer: all of it at once
    if (this.cut === null && this.fullyPlayed) return this.fullText;
    let chars = this.spokenChars(this.playedMs);
    if (this.cut !== null && chars < this.fullText.length) {
      // Cut mid-word: show the words that were whole.
      const space = this.fullText.lastIndexOf(" ", chars);
      if (!/\s/.test(this.fullText[chars] || "")) chars = space > 0 ? space : 0;
    }
    return this.fullText.slice(0, chars);
  }

  render() {
    const shown = this.shown();
    if (this.cut !== null) {
      this.textNode.textContent = shown ? `${shown.trimEnd()} —` : "—";
    } else {
      this.textNode.textContent = shown || "…";
    }
  }

  // The answer stops where it was heard: `playedMs` of its audio.
  cutAt(playedMs, why) {
    if (this.cut !== null) return;
    this.playedMs = playedMs;
    this.cut = why;
    this.node.classList.add("cut");
    this.foot.prepend(element("span", "badge interrupted", why));
    this.render();
  }

  latency(ms) {
    const label = `${(ms / 1000).toFixed(2)} s to first audio`;
    const chip = element("span", "latency", label);
    chip.title = "from the end of your speech to the answer's first sound";
    this.foot.append(chip);
  }
}
