"""The socket's projection of the journal (protocol.dialect) and the null rule
of the frame decoder, without a server."""

from __future__ import annotations

import msgspec
import pytest

from protocol.codec import FrameDecoder, encode_server_event
from protocol.dialect import Dialect, event_type, negotiate, present
from protocol.items import ContentPart, ServerItem
from protocol.server_events import (
    SERVER_EVENT_TYPES,
    AudioDelta,
    ItemCreated,
    ItemDone,
    OutputAudioDelta,
    OutputItemDone,
)


@pytest.mark.parametrize("tag", sorted(SERVER_EVENT_TYPES))
def test_the_type_is_read_off_every_encoded_event(tag):
    """present() relies on msgspec writing the tag first, for every event."""
    assert event_type(encode_server_event(SERVER_EVENT_TYPES[tag]())) == tag.encode()


def test_negotiation():
    assert negotiate(None, None) is Dialect.GA
    assert negotiate(None, "realtime=v1") is Dialect.BETA
    assert negotiate("both", "realtime=v1") is Dialect.BOTH
    assert negotiate("ga", "realtime=v1") is Dialect.GA
    assert negotiate("nonsense", None) is Dialect.GA


def test_each_dialect_skips_the_other_spelling():
    ga, beta = encode_server_event(OutputAudioDelta()), encode_server_event(AudioDelta())
    done = encode_server_event(ItemDone())
    assert (present(ga, Dialect.GA), present(beta, Dialect.GA)) == (ga, None)
    assert (present(ga, Dialect.BETA), present(beta, Dialect.BETA)) == (None, beta)
    assert present(done, Dialect.BETA) is None
    assert [present(p, Dialect.BOTH) for p in (ga, beta, done)] == [ga, beta, done]


def test_beta_gets_assistant_content_in_its_spelling():
    item = ServerItem(
        type="message", id="i", role="assistant", content=[ContentPart(type="output_audio")]
    )
    for event in (OutputItemDone(item=item), ItemCreated(item=item)):
        shown = msgspec.json.decode(present(encode_server_event(event), Dialect.BETA))
        assert shown["item"]["content"][0]["type"] == "audio"
    ga = msgspec.json.decode(present(encode_server_event(OutputItemDone(item=item)), Dialect.GA))
    assert ga["item"]["content"][0]["type"] == "output_audio"


def test_null_means_not_given_unless_null_means_something():
    decoder = FrameDecoder()
    update = decoder.decode(
        '{"type":"session.update","session":{"voice":null,"turn_detection":null,'
        '"audio":{"output":{"voice":null}}}}'
    )
    assert update.session.voice is msgspec.UNSET
    assert update.session.turn_detection is None  # null: model-owned turns
    assert update.session.audio.output.voice is msgspec.UNSET
    create = decoder.decode('{"type":"response.create","response":{"instructions":null}}')
    assert create.response.instructions is msgspec.UNSET
