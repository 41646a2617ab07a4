"""What a session actor's mailbox carries, one dataclass per kind of message.

Everything that changes a session arrives as one of these, in order: the
socket's commands (and its undecodable frames), engine output, attachment
changes and lifecycle orders. :data:`Message` is their union: the actor
takes it apart with one ``match`` ending in ``assert_never``, so a kind
added here and not handled there is a type error, never a silent drop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

# What a model's feed posts is a session input the core steps (core/model_output.py).
from duplex_server.sessions.core.model_output import Chunks, ModelFailed, StreamEnd, UnitOutputs
from duplex_server.sessions.core.records import CloseReason
from duplex_server.sessions.log.store import LeaseStatus
from duplex_server.sessions.runtime.attachment import Attachment
from protocol.client_events import ClientEvent, SessionResume
from protocol.errors import ProtocolError


@dataclass
class Client:
    event: ClientEvent
    generation: int
    received_at: float


@dataclass
class Reject:
    error: ProtocolError
    generation: int


@dataclass
class Heartbeat:
    """A socket's liveness signal queued behind its earlier commands, so its
    ack still means they were applied; it is never recorded."""

    generation: int


# Whether a caller may use a session its owner (a principal's name) opened.
OwnerCheck = Callable[[str | None], bool]


def anyone(owner: str | None) -> bool:
    return True


def not_yours(request: SessionResume) -> ProtocolError:
    return ProtocolError(
        "forbidden",
        "this session was opened with another key",
        param="session_id",
        event_id=request.event_id,
    )


@dataclass
class Resume:
    attachment: Attachment
    request: SessionResume
    done: asyncio.Future[None]
    may_use: OwnerCheck = anyone


@dataclass
class Detach:
    generation: int


@dataclass
class End:
    reason: CloseReason


@dataclass
class Suspend:
    pass


@dataclass
class LeaseLost:
    status: LeaseStatus


@dataclass
class Partial:
    """A partial transcript of speech still going on (server VAD)."""

    item_id: str
    text: str


@dataclass
class OverlapHeard:
    """The recogniser finished a decode of speech over the answer held for
    its words (``response_id``'s, begun at ``started_ms``): the words may
    decide it now, whether or not the client streams on."""

    response_id: str
    started_ms: float
    text: str
    until_ms: float  # the decode heard the input up to here (input timeline)
    heard_at: float  # perf clock: the decode began, on the chunk that ended its audio


# What hearing posts from its transcripts in flight (runtime/hearing.py).
HeardMessage = Partial | OverlapHeard

# What a socket sends, counted against the mailbox bound until applied.
SocketMessage = Client | Reject | Heartbeat
SOCKET_MESSAGES = (Client, Reject, Heartbeat)

# What a model's feed posts about the output it produced (runtime/*_feed.py).
ModelMessage = Chunks | StreamEnd | UnitOutputs | ModelFailed

# Orders about the session itself: attachments and the lifecycle.
ControlMessage = Resume | Detach | End | Suspend | LeaseLost

Message = SocketMessage | ModelMessage | ControlMessage | HeardMessage

# What cannot be applied without recording it: refused, not applied, while
# the log is down (the union for the type checker, the tuple for isinstance).
NeedsLog = Client | Reject | Resume | ModelMessage | HeardMessage
NEEDS_LOG = (
    Client,
    Reject,
    Resume,
    Chunks,
    StreamEnd,
    UnitOutputs,
    ModelFailed,
    Partial,
    OverlapHeard,
)
