"""``POST /v1/audio/speech``: text to speech as a one-shot job.

The body is OpenAI's (``model``, ``input``, ``voice``, ``instructions``,
``response_format``, ``speed``, ``stream_format``) with ``sample_rate`` and
``seed``, and vLLM-Omni's extras where they mean something here
(``language``, ``task_type``); everything else is refused by name. The
server's synthesiser speaks it through the engine at batch priority
(:mod:`duplex_server.models.batch_audio`), PyAV encodes it.

``stream_format`` absent: the whole file at the end (its header knows its
length). ``audio``: the file's bytes as each clause is synthesised (a WAV
header then says "length unknown"). ``sse``: ``speech.audio.delta`` events
with base64 audio, then ``speech.audio.done`` with usage.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from batch_api import http
from duplex_server.audio import resample_pcm16
from duplex_server.jobs.run import JobError, JobInput, JobKind, JobRequest
from duplex_server.jobs.runner import JobRunner
from duplex_server.models.batch_audio import BatchAudio, BatchSpeech

if TYPE_CHECKING:
    from duplex_server.audio.containers import AudioEncoder

ROUTE = "/v1/audio/speech"
MAX_INPUT_CHARS = 4096  # OpenAI's limit
DEFAULT_RATE_HZ = 24_000  # OpenAI's speech is 24 kHz
MIN_RATE_HZ, MAX_RATE_HZ = 8_000, 48_000
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
STREAM_FORMATS = ("audio", "sse")
LANGUAGE_NAMES = {"english": "en", "chinese": "zh", "french": "fr", "german": "de",
                  "spanish": "es", "italian": "it", "japanese": "ja", "korean": "ko",
                  "portuguese": "pt", "russian": "ru"}  # fmt: skip


class VoiceId(msgspec.Struct, forbid_unknown_fields=True):
    """A voice named as an object (OpenAI's custom voices: ``{"id": ...}``)."""

    id: str


class SpeechRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    input: str
    voice: str | VoiceId
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str | None = None
    sample_rate: int | None = None
    seed: int | None = None
    # vLLM-Omni's fields
    language: str | None = None
    task_type: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    max_new_tokens: int | None = None


# OpenAI's speech parameters refused whenever sent: none (each is a field
# above; one this synthesiser cannot honour is refused by its value).
REFUSED: dict[str, str] = {}


def _invalid(param: str, message: str, code: str = "invalid_value") -> JobError:
    return JobError(400, code, message, param)


def validate(req: SpeechRequest, audio: BatchAudio) -> SpeechRequest:
    """The request as the job will run it, or the 4xx that refuses it."""
    speech = _speech(audio, req.model)
    if not req.input.strip():
        raise _invalid("input", "input is empty", "string_below_min_length")
    if len(req.input) > MAX_INPUT_CHARS:
        raise _invalid(
            "input",
            f"input is {len(req.input)} characters, over the {MAX_INPUT_CHARS} allowed",
            "string_above_max_length",
        )
    voice = _voice(req, speech)
    if req.response_format not in RESPONSE_FORMATS:
        raise _invalid(
            "response_format",
            f"response_format {req.response_format!r}; available: {', '.join(RESPONSE_FORMATS)}",
        )
    if req.stream_format is not None and req.stream_format not in STREAM_FORMATS:
        raise _invalid(
            "stream_format",
            f"stream_format {req.stream_format!r}; available: {', '.join(STREAM_FORMATS)}",
        )
    if not speech.speed.low <= req.speed <= speech.speed.high:
        raise _invalid(
            "speed",
            f"speed {req.speed} is outside what {speech.name} speaks: "
            f"{speech.speed.low} to {speech.speed.high}",
        )
    _check_rate(req)
    _check_seed(req, speech)
    _refuse_unserved(req, speech, voice)
    return req


def _check_seed(req: SpeechRequest, speech: BatchSpeech) -> None:
    """A seed pins a sampling synthesiser's noise (VITS). eSpeak NG samples
    nothing, yet the same text differs by a few samples call to call (the
    library carries its pitch flutter from one call to the next, and nothing
    resets it), and Piper draws its noise inside onnxruntime: for them a seed
    would promise a repeatable output they cannot give, so it is refused."""
    if req.seed is None:
        return
    if not speech.seedable:
        raise _invalid(
            "seed",
            f"{speech.name} cannot be pinned by a seed: its output varies call to call "
            "whatever the seed (serve --tts vits:PATH for seeded speech)",
            "unsupported_value",
        )
    if not 0 <= req.seed < 2**63:
        raise _invalid("seed", "seed must be 0 to 2**63 - 1")


def _speech(audio: BatchAudio, model: str) -> BatchSpeech:
    speech = audio.speech
    if speech is None:
        raise JobError(
            404,
            "model_not_loaded",
            f"this server runs --model {audio.model_name}, which has no speech synthesiser "
            "(serve --model cascade)",
            "model",
        )
    if model not in speech.models:
        raise JobError(
            404,
            "model_not_found",
            f"model {model!r} is not served here; available: {', '.join(sorted(speech.models))}",
            "model",
        )
    return speech


def _voice(req: SpeechRequest, speech: BatchSpeech) -> str:
    """The synthesiser's own name for the voice asked for."""
    name = req.voice.id if isinstance(req.voice, VoiceId) else req.voice
    voice = speech.voice(name)
    if voice is None:
        raise _invalid("voice", f"unknown voice {name!r} for {speech.name}")
    return voice


def _check_rate(req: SpeechRequest) -> None:
    from duplex_server.audio.containers import rate_supported

    rate = req.sample_rate or DEFAULT_RATE_HZ
    if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
        raise _invalid("sample_rate", f"sample_rate must be {MIN_RATE_HZ} to {MAX_RATE_HZ} Hz")
    if not rate_supported(req.response_format, rate):
        raise _invalid("sample_rate", f"{req.response_format} cannot be encoded at {rate} Hz")


def _refuse_unserved(req: SpeechRequest, speech: BatchSpeech, voice: str) -> None:
    """Fields this synthesiser cannot honour: refused by name, never ignored."""
    if req.instructions:
        # gpt-4o-mini-tts reads a prompt ("speak cheerfully"); eSpeak NG,
        # Piper and VITS take no prompt, only a voice and a speed.
        raise _invalid(
            "instructions",
            f"{speech.name} takes no style instructions (only voice and speed); "
            "send none, or an empty string",
            "unsupported_value",
        )
    if req.task_type not in (None, "CustomVoice"):
        raise _invalid(
            "task_type",
            f"task_type {req.task_type!r}: only CustomVoice (the synthesiser's own voices)",
            "unsupported_value",
        )
    for param in ("ref_audio", "ref_text"):
        if getattr(req, param) is not None:
            raise _invalid(param, f"{speech.name} does not clone voices", "unsupported_value")
    if req.max_new_tokens is not None:
        raise _invalid("max_new_tokens", f"{speech.name} is not a token model", "unsupported_value")
    if req.language is not None and req.language.lower() != "auto":
        code = LANGUAGE_NAMES.get(req.language.lower(), req.language.lower())
        if code.split("-")[0] != voice.split("-")[0].split("+")[0]:
            raise _invalid(
                "language",
                f"voice {voice!r} speaks {voice.split('+')[0]}, not {req.language}; "
                "choose a voice of that language",
                "unsupported_value",
            )


def content_type(params: bytes) -> str:
    from duplex_server.audio.containers import CONTENT_TYPES

    req = msgspec.json.decode(params, type=SpeechRequest)
    if req.stream_format == "sse":
        return "text/event-stream"
    return CONTENT_TYPES[req.response_format]


def kind(audio: BatchAudio) -> JobKind:
    async def produce(given: JobInput) -> AsyncIterator[bytes]:
        req = msgspec.json.decode(given.params, type=SpeechRequest)
        # Checked again: the server may have restarted with another --model or --tts.
        speech = _speech(audio, req.model)
        _check_seed(req, speech)
        async for chunk in synthesise(req, speech, given):
            yield chunk

    return JobKind(ROUTE, produce, content_type)


async def synthesise(
    req: SpeechRequest, speech: BatchSpeech, given: JobInput
) -> AsyncIterator[bytes]:
    from duplex_server.audio.containers import AudioEncoder  # PyAV: loaded when used

    rate = req.sample_rate or DEFAULT_RATE_HZ
    whole = req.stream_format is None
    encoder = AudioEncoder(req.response_format, rate, seekable=whole)
    samples = 0
    async for pcm in speech.synthesize(req.input, _voice(req, speech), req.speed, req.seed):
        # Clause by clause (each starts and ends in the synthesiser's
        # silence), resampled and encoded off the event loop.
        count, encoded = await given.offload(_encode, encoder, pcm, speech.sample_rate_hz)
        samples += count
        if encoded and not whole:
            yield _sse_delta(encoded) if req.stream_format == "sse" else encoded
    encoded = await given.offload(encoder.finish)
    given.metadata.update(
        {"audio_seconds": samples / rate, "sample_rate": rate, "format": req.response_format}
    )
    if req.stream_format == "sse":
        if encoded:
            yield _sse_delta(encoded)
        yield _sse_done(req.input)
    elif encoded:
        yield encoded


def _encode(encoder: AudioEncoder, pcm: bytes, source_rate_hz: int) -> tuple[int, bytes]:
    """Samples at the output rate, and what the encoder wrote for them."""
    out = resample_pcm16(pcm, source_rate_hz, encoder.rate)
    return len(out) // 2, encoder.push(out)


def _sse(event: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _sse_delta(audio: bytes) -> bytes:
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode()})


def _sse_done(text: str) -> bytes:
    tokens = len(text.split())  # no tokenizer: words stand in for input tokens
    usage = {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens}
    return _sse({"type": "speech.audio.done", "usage": usage})


async def endpoint(request: Request) -> Response:
    state = request.app.state
    runner: JobRunner = state.batch.runner
    try:
        principal = http.principal_name(request)
        req = validate(await http.read_json(request, SpeechRequest, REFUSED), state.batch.audio)
        params = msgspec.json.encode(req)
        run = await runner.submit(
            JobRequest(ROUTE, principal, params, http.idempotency_key(request))
        )
    except JobError as exc:
        return http.error_response(exc)
    if req.stream_format is None:
        return await http.answer(run)
    await run.started()
    if run.outcome is not None and (run.outcome.error is not None or run.outcome.replayed):
        return await http.answer(run)
    # Sent as the clauses are synthesised; a client that hangs up stops
    # reading, not the job (its result is stored all the same).
    return StreamingResponse(
        http.streamed(run, sse=req.stream_format == "sse"),
        media_type=content_type(params),
        headers=http.job_headers(run),
    )
