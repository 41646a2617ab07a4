"""The I/O-free core of the client: frames in, typed events out.

``Demux.feed(frame)`` decodes one server frame, drops what a resume replays
twice, refuses what breaks the protocol (malformed JSON, unknown types, a
``server_event_seq`` that goes backwards outside a replay), and keeps the
per-response view that ``ResponseHandle`` exposes. No sockets, no clock: a
recorded stream replays through it exactly.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import msgspec

from clients.duplex.errors import DuplexProtocolError
from protocol import server_events as se
from protocol.audio_frames import MAGIC, FrameKind, unpack
from protocol.codec import decode_server_event
from protocol.errors import ProtocolError

_AUDIO_MAGIC = bytes([MAGIC])


class ConnectionResumed(msgspec.Struct):
    """Client-side event: the transport dropped and the session was resumed."""

    type: str = "connection.resumed"
    attachment_generation: int = 0
    replay_from_seq: int = 0
    replay_to_seq: int = 0


@dataclass
class ResponseView:
    """What one assistant response said and did, as the events told it."""

    response_id: str
    decision: str = "speak"  # or "listen"
    status: str = "in_progress"
    reason: str | None = None
    transcript: str = ""
    text: str = ""
    audio: list[bytes] = field(default_factory=list)
    audio_format: str = "pcm16"
    sample_rate_hz: int = 24_000
    generated_ms: float = 0.0
    played_ms: float = 0.0

    @property
    def done(self) -> bool:
        return self.status != "in_progress"


_BETA = tuple(beta for beta in se.BETA_TWIN.values())


def listen_key(event: se.ResponseListen) -> str:
    """A listen decision's entry in ``Demux.responses`` (it may have no response id)."""
    return event.response_id or f"listen_{event.server_event_seq}"


@dataclass
class _HeldDelta:
    """An audio delta event of a binary-audio socket, waiting for its frame;
    ``event`` None: a replay or a beta twin, whose frame is dropped with it."""

    seq: int
    event: se.OutputAudioDelta | None


class Demux:
    def __init__(self) -> None:
        self.last_seq = 0
        self.responses: dict[str, ResponseView] = {}
        self._replay_until = 0  # seqs up to here may arrive again after a resume
        # The socket carries audio in binary frames (``?audio=binary``, confirmed):
        # each audio delta event is followed by its frame (protocol.audio_frames).
        self.binary_audio = False
        self._held: _HeldDelta | None = None

    def expect_replay(self, upto: int) -> None:
        """A resume is under way: seqs up to ``upto`` may repeat; drop them."""
        self._replay_until = max(self._replay_until, upto)

    def use_binary_audio(self, on: bool) -> None:
        """A new socket: whether its audio comes in binary frames."""
        self.binary_audio = on
        self._held = None

    def feed(self, frame: str | bytes) -> se.ServerEvent | None:
        """The typed event, or None when the frame repeats one already
        processed (or, on a binary-audio socket, is an audio delta whose
        binary frame comes next: that frame returns the whole delta)."""
        if self.binary_audio and isinstance(frame, bytes) and frame[:1] == _AUDIO_MAGIC:
            return self._feed_audio(frame)
        if self._held is not None:
            raise DuplexProtocolError(
                "invalid_event", "an audio delta's binary frame did not follow it"
            )
        try:
            event = decode_server_event(frame)
        except msgspec.ValidationError as exc:
            raise DuplexProtocolError(
                "invalid_event", f"server sent an unknown or malformed event: {exc}"
            ) from None
        except msgspec.DecodeError as exc:
            raise DuplexProtocolError("invalid_json", f"server sent invalid JSON: {exc}") from None
        seq = event.server_event_seq
        if seq is not None:
            if seq <= self.last_seq:
                if seq <= self._replay_until:
                    self._hold(event, None)
                    return None  # replayed after a resume: already processed
                raise DuplexProtocolError(
                    "invalid_event",
                    f"server_event_seq went backwards ({seq} after {self.last_seq})",
                )
            self.last_seq = seq
        if isinstance(event, _BETA):
            self._hold(event, None)
            return None  # the GA twin carries the same content
        if self.binary_audio and isinstance(event, se.OutputAudioDelta):
            self._hold(event, event)
            return None
        self._track(event)
        return event

    def _hold(self, event: se.ServerEvent, keep: se.OutputAudioDelta | None) -> None:
        if self.binary_audio and isinstance(event, se.OutputAudioDelta):
            self._held = _HeldDelta(event.server_event_seq or 0, keep)

    def _feed_audio(self, frame: bytes) -> se.ServerEvent | None:
        try:
            audio = unpack(frame, len(frame))
        except ProtocolError as exc:
            raise DuplexProtocolError(exc.code, f"server sent {exc.message}") from None
        held, self._held = self._held, None
        if audio.kind is not FrameKind.OUTPUT_DELTA or held is None or held.seq != audio.sequence:
            raise DuplexProtocolError(
                "invalid_event",
                f"binary audio frame {audio.sequence} does not follow its audio delta event",
            )
        if held.event is None:
            return None
        event = msgspec.structs.replace(held.event, delta=base64.b64encode(audio.payload).decode())
        self._track(event, audio.payload)
        return event

    def _view(self, response_id: str) -> ResponseView:
        view = self.responses.get(response_id)
        if view is None:
            view = self.responses[response_id] = ResponseView(response_id)
        return view

    def _track(self, event: se.ServerEvent, audio: bytes | None = None) -> None:
        if isinstance(event, se.ResponseCreated) and event.response is not None:
            self._view(event.response.id)
        elif isinstance(event, se.ResponseListen):
            key = listen_key(event)
            self.responses[key] = ResponseView(key, decision="listen", status="completed")
        elif isinstance(event, se.OutputAudioDelta):
            view = self._view(event.response_id)
            view.audio.append(base64.b64decode(event.delta) if audio is None else audio)
            view.audio_format, view.sample_rate_hz = event.format, event.sample_rate_hz
            if event.metadata is not None:
                view.generated_ms = event.metadata.playback.generated_ms
        elif isinstance(event, se.OutputAudioTranscriptDelta):
            self._view(event.response_id).transcript += event.delta
        elif isinstance(event, se.OutputTextDelta):
            self._view(event.response_id).text += event.delta
        elif isinstance(event, se.ResponseDone) and event.response is not None:
            view = self._view(event.response.id)
            view.status = event.response.status
            # The server's own cause (barge_in, new_response, ...) is finer
            # than OpenAI's status_details.reason; fall back to the latter.
            duplex, details = event.response.duplex, event.response.status_details
            if duplex is not None and duplex.reason:
                view.reason = duplex.reason
            else:
                view.reason = details.reason if details and details.reason else None
        elif (
            isinstance(event, se.PlaybackAcknowledged)
            and event.response_id
            and event.playback is not None
        ):
            self._view(event.response_id).played_ms = event.playback.played_ms
