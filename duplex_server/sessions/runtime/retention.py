"""Input audio retention: what the log may forget, and when.

Under ``retain_audio="uncommitted"`` a turn's input samples are compacted to
metadata once the client acknowledged (``session.event_ack``) the
``input_audio_buffer.committed`` of that turn. Under ``"none"`` (keep no
audio) they go as soon as the log holds what ends the buffer they were in
(a commit, a clear, a cancel), acknowledged or not, and the samples still
held when the session closes go with its close, and so do the payloads of
its server events (their records, text and durations stay) and, with
``--media-dir``, the segments that held them. Neither ever changes the
folded state: the fold keeps durations and log references, never samples;
a resume replays the server's events, never the client's audio. Outbound
payloads (the answers' audio among them) are bounded apart from this: the
journal trims them as the client acknowledges them or as they leave its
replay window. Under ``"all"`` nothing is noted."""

from __future__ import annotations

from collections import deque

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.records import CloseBody, CommitBody, OutBody, SignalBody
from duplex_server.sessions.log.store import MediaRetaining, SessionLog

RETAIN_AUDIO = ("all", "uncommitted", "none")
# the signals that end an input buffer without a commit
_BUFFER_ENDS = frozenset({"input.clear", "input.cancel"})


class AudioRetention:
    def __init__(self, log: SessionLog, session_id: str, policy: str) -> None:
        if policy not in RETAIN_AUDIO:
            raise ValueError(f"retain_audio must be one of {RETAIN_AUDIO}, not {policy!r}")
        self._log = log
        self._session_id = session_id
        self._policy = policy
        # (server_event_seq of a turn's committed event, seq of its commit record)
        self._commits: deque[tuple[int, int]] = deque()
        # "none": the log's samples up to this seq are no longer needed
        self._unneeded_upto = 0
        self._compacted_upto = 0
        # "none", at close: the server events whose payloads can go (a closed
        # session is never resumed, so nothing replays them)
        self._closed_at_event = 0

    def note(self, batch: Batch) -> None:
        """Remember what an appended batch ended: the commits it recorded
        (``uncommitted``), or how far its samples are no longer needed (``none``)."""
        if self._policy == "all":
            return
        if self._policy == "none":
            self._note_unneeded(batch)
            return
        commit_seq = None
        for record in batch.records:
            body = record.body
            if isinstance(body, CommitBody) and body.is_speech:
                commit_seq = record.seq
            elif (
                commit_seq is not None
                and isinstance(body, OutBody)
                and body.event_type == "input_audio_buffer.committed"
            ):
                self._commits.append((body.server_event_seq, commit_seq))
                commit_seq = None

    def _note_unneeded(self, batch: Batch) -> None:
        for record in batch.records:
            body = record.body
            if (
                isinstance(body, CommitBody | CloseBody)
                or isinstance(body, SignalBody)
                and body.signal in _BUFFER_ENDS
            ):
                self._unneeded_upto = record.seq
            if isinstance(body, CloseBody):
                self._closed_at_event = batch.state.server_event_seq

    def due(self) -> bool:
        """Whether :meth:`landed` has anything to do (checked on every append,
        so that an append with nothing to forget builds no coroutine)."""
        return self._unneeded_upto > self._compacted_upto or bool(self._closed_at_event)

    async def landed(self) -> None:
        """``none``: compact what the batches noted so far no longer need;
        if the store refuses, the next batch's call covers it too."""
        if self._unneeded_upto > self._compacted_upto:
            upto = self._unneeded_upto
            await self._log.compact_audio(self._session_id, upto)
            self._compacted_upto = upto
        if self._closed_at_event:
            # the payloads go, the records and their text stay (OutBody.trimmed)
            await self._log.trim(self._session_id, self._closed_at_event)
            if isinstance(self._log, MediaRetaining):  # the sealed segments too
                await self._log.expire_media(self._session_id)
            self._closed_at_event = 0

    async def acknowledged(self, acked: int) -> None:
        """Compact the samples of every turn whose commit the client acknowledged;
        if the store refuses, those turns wait for the next acknowledgement."""
        covered = 0
        while covered < len(self._commits) and self._commits[covered][0] <= acked:
            covered += 1
        if covered:
            await self._log.compact_audio(self._session_id, self._commits[covered - 1][1])
            for _ in range(covered):
                self._commits.popleft()
