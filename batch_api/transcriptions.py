"""``POST /v1/audio/transcriptions``: speech to text as a one-shot job.

Multipart, as OpenAI takes it: ``file`` (any container PyAV reads),
``model``, ``language``, ``prompt``, ``response_format`` (``json``,
``text``, ``verbose_json``, ``srt``, ``vtt``), ``timestamp_granularities[]``
(``segment``, ``word`` where the recogniser times its words), ``temperature``
(0), ``stream``. The body is read as it arrives and refused past
``--max-upload-bytes``; an upload PyAV cannot decode is refused before any
job exists. The server's recogniser (``--asr``) hears it through the engine
at batch priority, a stretch between pauses per request
(:mod:`duplex_server.models.batch_audio`); the stretches are the segments
and the cues of ``srt`` / ``vtt``. ``stream=true`` answers Server-Sent
Events as OpenAI does: a ``transcript.text.delta`` per stretch as it is
heard (the deltas add up to the text), then ``transcript.text.done``; the
job's body is those events, so a retry under its key replays them.
``chunking_strategy`` ``auto`` or an untuned ``server_vad`` is that cutting
at pauses; ``languages`` naming one is ``language``; OpenAI's parameters no
recogniser here can honour (:data:`REFUSED`: ``include``, ``keywords``,
``known_speaker_*``) are refused ``unsupported_value`` with why.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from batch_api import http
from duplex_server.http_body import BodyTooLarge, limited_stream
from duplex_server.jobs.run import JobError, JobInput, JobKind, JobRequest
from duplex_server.jobs.runner import JobRunner
from duplex_server.models.batch_audio import BatchAudio, BatchTranscriber, Segment

ROUTE = "/v1/audio/transcriptions"
RATE_HZ = 16_000  # what the upload is decoded to; the recogniser resamples from it
MAX_AUDIO_S = 2 * 3600.0
MAX_FIELD_BYTES = 64 * 1024  # a form field other than the file (a prompt)
RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
STREAM_FORMATS = ("json", "text")  # what stream=true takes: the events carry text only
GRANULARITIES = ("segment", "word")
CONTENT_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}
LANGUAGE_NAMES = {"en": "english", "de": "german", "fr": "french", "es": "spanish",
                  "it": "italian", "nl": "dutch", "pt": "portuguese", "ru": "russian",
                  "zh": "chinese", "ja": "japanese", "ko": "korean"}  # fmt: skip
# OpenAI's transcription parameters this server refuses whenever they are sent, and why.
REFUSED = {
    "include": "the recogniser answers text, not token log probabilities",
    "keywords": "the recogniser takes no keyword list (a prompt, where it takes one)",
    "known_speaker_names": "the recogniser does not tell speakers apart",
    "known_speaker_references": "the recogniser does not tell speakers apart",
}
UPLOADS = ("file",)  # the job's upload, not a request field
# chunking_strategy's server_vad tuning: the pause detector's own are fixed
VAD_TUNING = ("threshold", "prefix_padding_ms", "silence_duration_ms")


class TranscriptionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The form's fields (the file is the job's upload)."""

    model: str
    filename: str = "audio"
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    timestamp_granularities: list[str] = msgspec.field(default_factory=list)
    languages: list[str] = msgspec.field(default_factory=list)
    temperature: float = 0.0
    chunking_strategy: str = "auto"  # auto or server_vad: the recording cut at its pauses
    stream: bool = False


def _invalid(param: str, message: str, code: str = "invalid_value") -> JobError:
    return JobError(400, code, message, param)


async def read_form(request: Request, limit: int) -> tuple[TranscriptionRequest, bytes]:
    """The multipart body, refused the moment it passes ``limit`` bytes."""
    media = request.headers.get("content-type", "")
    if not media.startswith("multipart/form-data"):
        raise JobError(400, "invalid_request_body", "send multipart/form-data with a file")
    parser = MultiPartParser(
        request.headers,
        limited_stream(request, limit),
        max_files=1,
        max_fields=32,
        max_part_size=MAX_FIELD_BYTES,
    )
    try:
        form = await parser.parse()
    except BodyTooLarge:
        raise JobError(
            413, "payload_too_large", f"the upload is over {limit} bytes", "file"
        ) from None
    except MultiPartException as exc:
        raise JobError(400, "invalid_request_body", f"bad multipart body: {exc}") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise JobError(400, "missing_required_parameter", "file is required", "file")
        data = await upload.read()
        return _fields(form, upload.filename or "audio"), data
    finally:
        await form.close()


def _fields(form: FormData, filename: str) -> TranscriptionRequest:
    fields: dict[str, object] = {"filename": filename}
    vad: dict[str, str] = {}
    for name, value in form.multi_items():
        if name == "file":
            continue
        param = http.form_name(name)
        if param in REFUSED:
            raise http.unsupported(param, REFUSED[param])
        if not isinstance(value, str):
            raise _invalid(name, f"{name} must be a text field", "invalid_type")
        if param in ("timestamp_granularities", "languages"):
            listed = fields.setdefault(param, [])
            assert isinstance(listed, list)
            listed.append(value)
        elif param == "chunking_strategy" and name != param:
            vad[name[len(param) :].strip("[]")] = value  # chunking_strategy[type]=server_vad
        elif name == "chunking_strategy" and value.lstrip().startswith("{"):
            vad.update(_json_object(name, value))  # the object as JSON text, as curl sends it
        elif name == "temperature":
            fields[name] = _temperature(value)
        elif name == "stream":
            fields[name] = _flag(name, value)
        elif name in fields:
            raise _invalid(name, f"{name} given twice")
        else:
            fields[name] = value
    if vad:
        fields["chunking_strategy"] = _vad(vad)
    return http.decode_struct(json.dumps(fields).encode(), TranscriptionRequest, REFUSED)


def _json_object(name: str, value: str) -> dict[str, str]:
    try:
        given = json.loads(value)
    except ValueError:
        raise _invalid(name, f"{name} is not JSON", "invalid_type") from None
    if not isinstance(given, dict):
        raise _invalid(name, f"{name} is auto or an object", "invalid_type")
    return {str(key): str(item) for key, item in given.items()}


def _vad(given: dict[str, str]) -> str:
    """A ``server_vad`` chunking strategy, as the SDK sends one (its keys
    as ``chunking_strategy[key]``): served when it tunes nothing, since the
    recording is cut at its pauses by a detector whose settings are fixed."""
    if given.get("type") != "server_vad":
        raise _invalid("chunking_strategy", "chunking_strategy is auto or a server_vad object")
    tuned = sorted(key for key in given if key != "type")
    unknown = [key for key in tuned if key not in VAD_TUNING]
    if unknown:
        raise _invalid("chunking_strategy", f"server_vad has no {', '.join(unknown)}")
    if tuned:
        raise http.unsupported(
            "chunking_strategy",
            f"the pause detector's settings are fixed; send server_vad without {', '.join(tuned)}",
        )
    return "server_vad"


def _flag(name: str, value: str) -> bool:
    """A multipart boolean, as the SDK sends one (``true`` / ``false``)."""
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise _invalid(name, f"{name} is true or false, not {value!r}", "invalid_type")


def _temperature(value: str) -> float:
    try:
        temperature = float(value)
    except ValueError:
        raise _invalid("temperature", "temperature must be a number", "invalid_type") from None
    if temperature != 0:
        raise _invalid(
            "temperature",
            "the recogniser decodes greedily: temperature 0 only",
            "unsupported_value",
        )
    return temperature


def validate(req: TranscriptionRequest, audio: BatchAudio) -> BatchTranscriber:
    asr = _transcriber(audio, req.model)
    if req.response_format == "diarized_json":
        raise _invalid(
            "response_format",
            "the recogniser does not tell speakers apart: no diarized_json",
            "unsupported_value",
        )
    if req.chunking_strategy not in ("auto", "server_vad"):
        raise _invalid("chunking_strategy", "chunking_strategy is auto or a server_vad object")
    _check_languages(req, asr)
    if req.response_format not in RESPONSE_FORMATS:
        raise _invalid(
            "response_format",
            f"response_format {req.response_format!r}; available: {', '.join(RESPONSE_FORMATS)}",
        )
    for granularity in req.timestamp_granularities:
        if granularity not in GRANULARITIES:
            raise _invalid("timestamp_granularities", f"unknown granularity {granularity!r}")
        if granularity == "word" and not asr.word_times:
            raise _invalid(
                "timestamp_granularities",
                f"{asr.name} gives segment times, not word times",
                "unsupported_value",
            )
    if req.timestamp_granularities and req.response_format != "verbose_json":
        raise _invalid(
            "timestamp_granularities", "timestamps come with response_format verbose_json"
        )
    if req.stream and req.response_format not in STREAM_FORMATS:
        raise _invalid(
            "response_format",
            f"a streamed transcription is text events: response_format "
            f"{' or '.join(STREAM_FORMATS)}, not {req.response_format!r}",
            "unsupported_value",
        )
    language = language_of(req)
    if language is not None:
        param = "language" if req.language is not None else "languages"
        if asr.languages is not None and language not in asr.languages:
            raise _invalid(
                param,
                f"{asr.name} hears {', '.join(sorted(asr.languages))}, not {language!r}",
                "unsupported_value",
            )
        if len(language) not in (2, 3) or not language.isalpha():
            raise _invalid(param, "language is an ISO-639-1 code such as 'en'")
    if req.prompt and not asr.takes_prompt:
        raise _invalid("prompt", f"{asr.name} takes no prompt", "unsupported_value")
    return asr


def _check_languages(req: TranscriptionRequest, asr: BatchTranscriber) -> None:
    """``languages`` (the ones the audio may be in): honoured as ``language``
    when it names one; the recogniser detects no language among several."""
    if not req.languages:
        return
    if len(req.languages) > 1:
        raise _invalid(
            "languages",
            f"{asr.name} hears one language per request: send one (or language)",
            "unsupported_value",
        )
    if req.language is not None and req.language != req.languages[0]:
        raise _invalid("languages", "languages and language name different languages")


def language_of(req: TranscriptionRequest) -> str | None:
    return req.language or (req.languages[0] if req.languages else None)


def _transcriber(audio: BatchAudio, model: str) -> BatchTranscriber:
    asr = audio.transcriber
    if asr is None:
        raise JobError(
            404,
            "model_not_loaded",
            f"this server runs --model {audio.model_name}, which has no speech recogniser "
            "(serve --model cascade)",
            "model",
        )
    if model not in asr.models:
        raise JobError(
            404,
            "model_not_found",
            f"model {model!r} is not served here; available: {', '.join(sorted(asr.models))}",
            "model",
        )
    return asr


def decode_upload(data: bytes) -> bytes:
    from duplex_server.audio.containers import AudioFileError, decode

    try:
        return decode(data, RATE_HZ, MAX_AUDIO_S)
    except AudioFileError as exc:
        raise _invalid("file", str(exc), "invalid_audio") from None


def content_type(params: bytes) -> str:
    req = msgspec.json.decode(params, type=TranscriptionRequest)
    return "text/event-stream" if req.stream else CONTENT_TYPES[req.response_format]


def kind(audio: BatchAudio) -> JobKind:
    async def produce(given: JobInput) -> AsyncIterator[bytes]:
        req = msgspec.json.decode(given.params, type=TranscriptionRequest)
        asr = validate(req, audio)  # again: a restart may have changed --model or --asr
        pcm = await given.offload(decode_upload, given.uploads[0])
        duration = len(pcm) / 2 / RATE_HZ
        given.metadata["audio_seconds"] = duration
        if req.stream:
            async for event in stream_events(req, asr, pcm, given):
                yield event
            return
        words = "word" in req.timestamp_granularities
        segments = await asr.segments(pcm, RATE_HZ, language_of(req), req.prompt, words)
        given.metadata["segments"] = len(segments)
        yield render(req, asr, segments, duration)

    return JobKind(ROUTE, produce, content_type)


async def stream_events(
    req: TranscriptionRequest, asr: BatchTranscriber, pcm: bytes, given: JobInput
) -> AsyncIterator[bytes]:
    """A ``transcript.text.delta`` per stretch as the recogniser hears it
    (after the first, with the space that joins it to the text before), then
    ``transcript.text.done`` with the whole text. No ``usage``: OpenAI's is
    tokens billed, and this recogniser bills nothing and counts no tokens."""
    texts: list[str] = []
    async for segment in asr.heard(pcm, RATE_HZ, language_of(req), req.prompt):
        delta = segment.text if not texts else " " + segment.text
        texts.append(segment.text)
        yield _sse({"type": "transcript.text.delta", "delta": delta})
    given.metadata["segments"] = len(texts)
    yield _sse({"type": "transcript.text.done", "text": " ".join(texts)})


def _sse(event: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def render(
    req: TranscriptionRequest, asr: BatchTranscriber, segments: list[Segment], duration: float
) -> bytes:
    text = " ".join(segment.text for segment in segments)
    fmt = req.response_format
    if fmt == "text":
        return (text + "\n").encode()
    if fmt == "srt":
        return _subtitles(segments, ",", numbered=True).encode()
    if fmt == "vtt":
        return ("WEBVTT\n\n" + _subtitles(segments, ".", numbered=False)).encode()
    usage = {"type": "duration", "seconds": round(duration, 3)}
    if fmt == "json":
        return json.dumps({"text": text, "usage": usage}).encode()
    language = language_of(req) or (
        next(iter(asr.languages)) if asr.languages and len(asr.languages) == 1 else None
    )
    verbose: dict[str, object] = {
        "task": "transcribe",
        "language": LANGUAGE_NAMES.get(language or "", language),
        "duration": round(duration, 3),
        "text": text,
    }
    granularities = req.timestamp_granularities
    if not granularities or "segment" in granularities:  # OpenAI's default: segments
        verbose["segments"] = [
            {"id": i, "seek": 0, "start": s.start_s, "end": s.end_s, "text": s.text}
            for i, s in enumerate(segments)
        ]
    if "word" in granularities:
        verbose["words"] = [
            {"word": w.word, "start": round(w.start_s, 3), "end": round(w.end_s, 3)}
            for s in segments
            for w in s.words
        ]
    verbose["usage"] = usage
    return json.dumps(verbose).encode()


def _stamp(seconds: float, comma: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02}:{m:02}:{s:02}{comma}{ms:03}"


def _subtitles(segments: list[Segment], comma: str, numbered: bool) -> str:
    cues = []
    for index, segment in enumerate(segments, start=1):
        times = f"{_stamp(segment.start_s, comma)} --> {_stamp(segment.end_s, comma)}"
        cues.append((f"{index}\n" if numbered else "") + f"{times}\n{segment.text}\n")
    return "\n".join(cues)


async def endpoint(request: Request) -> Response:
    state = request.app.state
    runner: JobRunner = state.batch.runner
    try:
        principal = http.principal_name(request)
        req, data = await read_form(request, state.config.max_upload_bytes)
        validate(req, state.batch.audio)
        await runner.offload(decode_upload, data)  # refused here, before any job exists
        media = req.filename.rsplit(".", 1)[-1].lower() if "." in req.filename else "bin"
        run = await runner.submit(
            JobRequest(
                ROUTE,
                principal,
                msgspec.json.encode(req),
                http.idempotency_key(request),
                [(data, f"audio/{media}")],
            )
        )
    except JobError as exc:
        return http.error_response(exc)
    if not req.stream:
        return await http.answer(run)
    await run.started()
    if run.outcome is not None and (run.outcome.error is not None or run.outcome.replayed):
        return await http.answer(run)
    # Sent as the stretches are heard; a client that hangs up stops reading,
    # not the job (its result is stored all the same).
    return StreamingResponse(
        http.streamed(run, sse=True), media_type="text/event-stream", headers=http.job_headers(run)
    )
