"""Input audio retention: what the log may forget once the client knows.

Under ``retain_audio="uncommitted"`` a turn's input samples are compacted to
metadata once the client acknowledged (``session.event_ack``) the
``input_audio_buffer.committed`` of that turn; the fold never needed the
samples, so the state does not change. Under ``"all"`` nothing is noted."""

from __future__ import annotations

from collections import deque

from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.records import CommitBody, OutBody
from duplex_server.sessions.log.store import SessionLog


class AudioRetention:
    def __init__(self, log: SessionLog, session_id: str, policy: str) -> None:
        self._log = log
        self._session_id = session_id
        self._policy = policy
        # (server_event_seq of a turn's committed event, seq of its commit record)
        self._commits: deque[tuple[int, int]] = deque()

    def note(self, batch: Batch) -> None:
        """Remember the commits an appended batch recorded."""
        if self._policy == "all":
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
