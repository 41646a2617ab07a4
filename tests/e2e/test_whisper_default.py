"""The embedded default recogniser: Whisper tiny.en on CTranslate2, loaded
offline from its registry package, hearing open speech (no phrase list),
with the turn's stage times reported on ``response.done``."""

from __future__ import annotations

import re

import pytest

from duplex_server.config import ServerConfig
from duplex_server.engine.audio.whisper_ct2 import packaged_model_path
from tests.conftest import free_port, running_server
from tests.e2e.test_voice import first, silence, stream_paced, vad_session
from tests.speech import speak

# Questions tiny.en hears word for word in eSpeak's voice whatever silence
# surrounds them (checked at leads of 300 and 500 ms, tails of 150 to 700 ms).
QUESTIONS = [
    "how far away is the moon",
    "what is the capital of spain",
]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


@pytest.fixture
async def whisper_server(request):
    """The default cascade (``--asr auto``: Whisper from its package); a
    ``server_config`` marker overrides settings."""
    assert packaged_model_path() is not None, "make test installs the voice extra"
    marker = request.node.get_closest_marker("server_config")
    overrides = marker.kwargs if marker is not None else {}
    config = ServerConfig(port=free_port(), store="memory", model="cascade", **overrides)
    async with running_server(config) as running:
        yield running
        await running.assert_replay_determinism()


async def test_the_default_recogniser_is_whisper_from_its_package(whisper_server):
    asr = whisper_server.app.state.model.listening.asr
    assert asr.name == f"whisper-ct2:{packaged_model_path()}"


@pytest.mark.parametrize("question", QUESTIONS)
async def test_open_speech_is_heard_and_answered_with_stage_times(whisper_server, question):
    client = await vad_session(whisper_server)
    await stream_paced(client, silence(500) + speak(question) + silence(1200), chunk_ms=20)
    events = await client.recv_until("response.done", timeout=30)
    heard = first(events, "conversation.item.input_audio_transcription.completed")
    assert words(heard["transcript"]) == words(question)
    transcript = first(events, "response.output_audio_transcript.done")["transcript"]
    assert words(transcript) == ["you", "said", *words(question)]
    done = events[-1]
    stages = done["response"]["duplex"]["stage_metrics"]
    assert set(stages) == {
        "vad_hangover_ms",
        "asr_final_ms",
        "first_clause_ready_ms",
        "tts_first_clause_ms",
    }
    # The VAD waited out the session's silence_duration_ms (500), give or
    # take a scoring window and a chunk.
    assert 450 <= stages["vad_hangover_ms"] <= 600
    assert stages["asr_final_ms"] >= 0 and stages["tts_first_clause_ms"] > 0
    assert stages["first_clause_ready_ms"] >= 0
    assert done["vllm_omni"]["stage_metrics"] == stages


async def test_partial_transcripts_while_the_user_speaks(whisper_server):
    client = await vad_session(whisper_server)
    long = "can you recommend a good book to read on a long train journey"
    await stream_paced(client, silence(300) + speak(long) + silence(1200), chunk_ms=20)
    events = await client.recv_until("response.done", timeout=30)
    types = [e["type"] for e in events]
    partial = types.index("conversation.item.input_audio_transcription.delta")
    assert partial < types.index("input_audio_buffer.speech_stopped")


async def test_language_and_prompt_are_honoured_or_refused(whisper_server):
    client, _ = await whisper_server.open()
    # tiny.en hears English only: another language is refused, by name.
    await client.send(
        {
            "type": "session.update",
            "session": {"input_audio_transcription": {"model": "whisper-1", "language": "fr"}},
        }
    )
    error = await client.expect("error")
    assert error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.input_audio_transcription.language"
    # English and a prompt are taken; the prompt steers the spelling of a name.
    setting = {"model": "whisper-1", "language": "en", "prompt": "Aoife, Siobhan"}
    await client.send({"type": "session.update", "session": {"input_audio_transcription": setting}})
    updated = await client.expect("session.updated")
    assert updated["session"]["input_audio_transcription"]["prompt"] == "Aoife, Siobhan"


async def test_pocketsphinx_refuses_a_prompt(voice_server):
    client, _ = await voice_server.open()
    setting = {"model": "whisper-1", "prompt": "names"}
    await client.send({"type": "session.update", "session": {"input_audio_transcription": setting}})
    error = await client.expect("error")
    assert error["error"]["code"] == "invalid_value"
    assert error["error"]["param"] == "session.input_audio_transcription.prompt"
    await client.send({"type": "session.heartbeat"})
    await client.recv_until("session.heartbeat_ack")


def test_a_decoder_repeating_itself_is_caught():
    from duplex_server.engine.audio.whisper_ct2 import is_loop

    # Heard in this session's bench: a one-second card name, decoded as a loop.
    loop = "10 of clubs 10 of club clubs 10 off clubs 10 up clubs 10 have clubs"
    assert is_loop(loop, 1.5)
    assert is_loop("tell me something interesting " * 4, 3.0)
    assert not is_loop("Ten of clubs.", 1.5)
    assert not is_loop("What is the weather like in Paris today?", 2.5)
    assert is_loop("4. Queen of Cloves 4. Queen of Cloves 4. Queen of Cloves 4", 2.0)


def test_asr_specs_resolve_as_documented(tmp_path):
    from duplex_server.models.cascade.stages import build_recogniser, resolve_asr

    path = packaged_model_path()
    assert resolve_asr("auto", None) == "whisper-ct2"
    assert resolve_asr("auto", ["open the door"]) == "pocketsphinx"  # a grammar is Sphinx's
    assert build_recogniser(f"whisper-ct2:{path}", None).name == f"whisper-ct2:{path}"
    with pytest.raises(ValueError, match="grammar mode"):
        build_recogniser("whisper-ct2", ["open the door"])
    with pytest.raises(ValueError, match="not a CTranslate2 Whisper directory"):
        build_recogniser(f"whisper-ct2:{tmp_path}", None)


async def test_openais_newer_transcription_fields_are_honoured_or_refused(whisper_server):
    """Every field of the SDK's ``AudioTranscription``: ``keywords`` and a
    one-language ``languages`` are taken (and echoed); ``delay``, a second
    language on tiny.en and a key OpenAI does not define are refused by
    name, the session serving on."""
    client, _ = await whisper_server.open()

    async def refused(setting: dict, param: str, code: str = "invalid_value") -> None:
        update = {"input_audio_transcription": setting}
        await client.send({"type": "session.update", "session": update})
        error = await client.expect("error")
        assert error["error"]["code"] == code, error
        assert error["error"].get("param", "").startswith(param), error

    await refused({"model": "whisper-1", "delay": "low"}, "session.input_audio_transcription.delay")
    await refused(
        {"model": "whisper-1", "languages": ["en", "fr"]},
        "session.input_audio_transcription.languages",
    )
    await refused(
        {"model": "whisper-1", "languages": ["de"]}, "session.input_audio_transcription.languages"
    )
    await refused({"model": "whisper-1", "diarize": True}, "session", code="invalid_event")
    setting = {"model": "whisper-1", "languages": ["en"], "keywords": ["Aoife", "Siobhan"]}
    await client.send({"type": "session.update", "session": {"input_audio_transcription": setting}})
    updated = await client.expect("session.updated")
    echoed = updated["session"]["input_audio_transcription"]
    assert echoed["keywords"] == ["Aoife", "Siobhan"] and echoed["languages"] == ["en"]


def test_every_field_of_the_sdks_transcription_settings_is_known():
    """A field the openai SDK adds to its transcription settings must be
    decided here (honoured or refused), not dropped: the struct knows each."""
    from openai.types.realtime.audio_transcription import AudioTranscription

    from protocol.session_config import InputTranscription

    assert set(AudioTranscription.model_fields) <= set(InputTranscription.__struct_fields__)


def test_keywords_join_the_prompt_and_one_language_is_the_language():
    from protocol.session_config import InputTranscription

    settings = InputTranscription(prompt="Names:", keywords=["Aoife", "Siobhan"], languages=["en"])
    assert settings.heard_prompt() == "Names: Aoife, Siobhan"
    assert settings.heard_language() == "en"
    assert InputTranscription(languages=["en", "fr"]).heard_language() is None
    assert InputTranscription(language="fr", languages=["en"]).heard_language() == "fr"
    assert InputTranscription().heard_prompt() is None
