"""The cascade's recogniser and voice on another server: an OpenAI-compatible
``/v1`` base (Speaches, Kokoro-FastAPI, OpenAI, another duplex-server)
answering ``POST /audio/transcriptions`` (``--asr-url``) and
``POST /audio/speech`` with ``response_format=pcm`` (``--tts-url``).

Both implement the local stages' protocols (:class:`Recogniser`,
:class:`Synthesiser` in ``models/cascade/stages.py``) and run on the
stage's worker threads like a local model, so the stage metrics, the
priority of a turn's final transcript over partials, the fences and the
failures are the local stages' own: a remote that fails raises, and the
stage turns that into the same ``engine_error`` a local stage's failure
gives. Each tier holds one ``httpx.Client`` (its connections kept alive and
reused), as many connections as the stage has workers, so what is in flight
to the remote is bounded by the stage.

A request is tried again only when no answer came: the connection refused,
reset or closed before a status line, or a 429 / 502 / 503 / 504 (the
remote did not take it). A read timeout is not retried (the remote may be
working on it), and nothing is asked again once its text or audio began.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from duplex_server.audio.containers import encode
from duplex_server.engine.probe import SharedProbe

log = logging.getLogger(__name__)

ASR_RATE_HZ = 16_000  # what the cascade hands its recogniser
RETRIED_STATUSES = frozenset({429, 502, 503, 504})
# Failures where the request surely got no answer: tried again.
RETRIED_ERRORS = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.RemoteProtocolError,  # a kept-alive connection the remote had closed
    httpx.ReadError,
    httpx.WriteError,
)
PROBE_TIMEOUT_S = 2.0
MAX_ERROR_BYTES = 4096  # of a refusal's body, quoted in the error


@dataclass(frozen=True)
class RemoteSpeechOptions:
    """``--asr-url`` or ``--tts-url`` and the options they share."""

    url: str  # the /v1 base
    model: str  # the request's ``model``
    api_key: str | None = None  # sent as a Bearer header
    timeout_s: float = 30.0  # connect, and the longest wait for the next bytes
    retries: int = 2  # more tries while no answer came
    max_requests: int = 4  # in flight to the remote at once (the stage's workers)
    sample_rate_hz: int = 24_000  # --tts-url: the rate of the pcm it answers

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"{self.url}: give an http:// or https:// /v1 base")


class RemoteSpeechError(Exception):
    """The remote refused the request, broke off or does not answer."""


class RemoteRefusal(RemoteSpeechError):
    """The remote answered with a status other than 200."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class RemoteTier:
    """One remote tier's connections, its retry policy and its probe."""

    def __init__(self, options: RemoteSpeechOptions, tier: str) -> None:
        self.options = options
        self.tier = tier  # "speech recogniser" / "voice", for the errors
        self.base = options.url.rstrip("/")
        self._headers = {}
        if options.api_key:
            self._headers["authorization"] = f"Bearer {options.api_key}"
        limit = options.max_requests
        self._client = httpx.Client(
            headers=self._headers,
            timeout=httpx.Timeout(options.timeout_s),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
        )
        self._async: httpx.AsyncClient | None = None
        self._probe = SharedProbe(self._probe_models)
        self.retried = 0  # tries made again (the wire test counts them)

    @contextmanager
    def answer(self, path: str, **request: Any) -> Iterator[httpx.Response]:
        """The remote's 200 response to ``POST {base}{path}``, its body still
        to be read; raises :class:`RemoteRefusal` for any other status."""
        url = f"{self.base}{path}"
        tries = 0
        while True:
            tries += 1
            try:
                response = self._client.send(
                    self._client.build_request("POST", url, **request), stream=True
                )
            except RETRIED_ERRORS as exc:
                if tries > self.options.retries:
                    raise RemoteSpeechError(
                        f"the {self.tier} at {self.base} does not answer ({exc!r})"
                    ) from exc
                self._back_off(tries, None)
                continue
            except httpx.TransportError as exc:  # a timeout: it may be working on it
                raise RemoteSpeechError(
                    f"the {self.tier} at {self.base} does not answer ({exc!r})"
                ) from exc
            if response.status_code == 200:
                break
            detail = _refusal_text(response)
            if response.status_code in RETRIED_STATUSES and tries <= self.options.retries:
                self._back_off(tries, response.headers.get("retry-after"))
                continue
            raise RemoteRefusal(
                f"the {self.tier} at {self.base} refused the request "
                f"({response.status_code}: {detail})",
                response.status_code,
                detail,
            )
        try:
            yield response
        except httpx.TransportError as exc:  # mid-answer: never asked for again
            raise RemoteSpeechError(
                f"the {self.tier} at {self.base} failed mid-answer ({exc!r})"
            ) from exc
        finally:
            response.close()

    def _back_off(self, tries: int, retry_after: str | None) -> None:
        self.retried += 1
        delay = 0.2 * 2 ** (tries - 1)
        if retry_after is not None and retry_after.isdigit():
            delay = min(float(retry_after), self.options.timeout_s)
        time.sleep(delay)  # on the stage's worker thread, never the event loop

    async def unreachable(self) -> str | None:
        """Why the remote cannot answer now (None: it can): ``GET /models``
        answers, and takes the key. One probe at a time, its answer reused a
        second. Not whether it serves ``--asr-model`` / ``--tts-model``:
        speech servers list their models unevenly (OpenAI's aliases often
        not at all); a model it does not serve fails the turn by name."""
        return await self._probe()

    async def _probe_models(self) -> str | None:
        if self._async is None:  # made on the loop that uses it
            self._async = httpx.AsyncClient(headers=self._headers)
        try:
            answer = await self._async.get(f"{self.base}/models", timeout=PROBE_TIMEOUT_S)
        except httpx.TransportError as exc:
            return f"the {self.tier} at {self.base} does not answer ({type(exc).__name__})"
        if answer.status_code in (401, 403) or answer.status_code >= 500:
            return f"the {self.tier} at {self.base} answers {answer.status_code} to GET /models"
        return None

    def close(self) -> None:
        self._client.close()


class RemoteRecogniser:
    """A :class:`Recogniser` on another server: each turn (or partial) one
    multipart ``POST /audio/transcriptions`` with the turn as a WAV file.
    ``stream=true`` is asked for; a server that answers Server-Sent Events
    (``transcript.text.delta`` …, ``transcript.text.done``) is read as
    they come, one that answers JSON or text is read whole, and one that
    refuses the field (a 400 naming ``stream``) is asked again without it,
    and from then on never with it."""

    languages: frozenset[str] | None = None  # the remote's to refuse
    takes_prompt = True

    def __init__(self, options: RemoteSpeechOptions) -> None:
        self.remote = RemoteTier(options, "speech recogniser")
        self.name = options.model
        self.workers = options.max_requests
        self.stream = True

    def transcribe(self, pcm16: bytes, language: str | None, prompt: str | None) -> str:
        try:
            return self._heard(pcm16, language, prompt)
        except RemoteRefusal as refusal:
            if not (self.stream and refusal.status == 400 and "stream" in refusal.detail.lower()):
                raise
            log.warning("%s takes no stream=true: transcribing whole", self.remote.base)
            self.stream = False
            return self._heard(pcm16, language, prompt)

    def form(self, language: str | None, prompt: str | None) -> dict[str, str]:
        fields = {"model": self.remote.options.model, "response_format": "json"}
        if self.stream:
            fields["stream"] = "true"
        if language:
            fields["language"] = language
        if prompt:
            fields["prompt"] = prompt
        return fields

    def _heard(self, pcm16: bytes, language: str | None, prompt: str | None) -> str:
        files = {"file": ("turn.wav", encode(pcm16, "wav", ASR_RATE_HZ), "audio/wav")}
        with self.remote.answer(
            "/audio/transcriptions", data=self.form(language, prompt), files=files
        ) as response:
            media = response.headers.get("content-type", "")
            if media.startswith("text/event-stream"):
                return transcript_of_events(response.iter_lines(), self.remote.base)
            body = response.read()
        if media.startswith("application/json"):
            try:
                text = json.loads(body)["text"]
            except (ValueError, KeyError, TypeError) as exc:
                raise RemoteSpeechError(
                    f"the speech recogniser at {self.remote.base} answered no text: {body[:200]!r}"
                ) from exc
            if not isinstance(text, str):
                raise RemoteSpeechError(f"the speech recogniser answered {text!r} as its text")
            return text.strip()
        return body.decode("utf-8", "replace").strip()

    def close(self) -> None:
        self.remote.close()


def transcript_of_events(lines: Iterable[str], base: str) -> str:
    """The text of a streamed transcription: ``transcript.text.done``'s, or
    the deltas'; an ``error`` event, or a stream that ends before its done,
    is a failure (what a half-heard turn would say is not guessed)."""
    deltas: list[str] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise RemoteSpeechError(
                f"the speech recogniser at {base} streamed {data[:200]!r}"
            ) from exc
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "transcript.text.delta":
            deltas.append(str(event.get("delta", "")))
        elif kind == "transcript.text.done":
            return str(event.get("text", "".join(deltas))).strip()
        elif kind == "error" or (isinstance(event, dict) and "error" in event):
            raise RemoteSpeechError(f"the speech recogniser at {base} failed: {event}")
    raise RemoteSpeechError(f"the speech recogniser at {base} broke off before its text was done")


class RemoteSynthesiser:
    """A :class:`Synthesiser` on another server: each clause one
    ``POST /audio/speech`` (``response_format=pcm``: 16-bit mono at
    ``--tts-sample-rate``, OpenAI's 24 kHz by default), read as it streams.
    The session's voice goes as the session named it: the cascade maps
    OpenAI's names onto eSpeak NG's before the synthesiser sees them, so
    ``openai_names`` (that map) maps them back; any other name is the
    remote's own voice, passed through (the remote refuses one it lacks,
    and the clause fails)."""

    def __init__(self, options: RemoteSpeechOptions, openai_names: Mapping[str, str]) -> None:
        self.remote = RemoteTier(options, "voice")
        self.sample_rate_hz = options.sample_rate_hz
        self.workers = options.max_requests
        # the cascade's own voice -> the OpenAI name it stands for ("default" is alloy's too)
        self._names = {own: name for name, own in openai_names.items() if name != "default"}

    def knows_voice(self, voice: str) -> bool:
        return True  # the remote's voices are its own: passed through

    def voice_of(self, voice: str) -> str:
        return self._names.get(voice, voice)

    def body(self, text: str, voice: str, speed: float) -> dict[str, object]:
        return {
            "model": self.remote.options.model,
            "input": text,
            "voice": self.voice_of(voice),
            "response_format": "pcm",
            "speed": speed,
        }

    def synthesize(self, text: str, voice: str, speed: float) -> bytes:
        with self.remote.answer("/audio/speech", json=self.body(text, voice, speed)) as response:
            return b"".join(pcm16_pieces(response.iter_bytes()))

    def close(self) -> None:
        self.remote.close()


def pcm16_pieces(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A pcm16 stream in whole samples: a chunk that ends mid-sample keeps
    its last byte for the next; a stray byte at the very end is dropped."""
    held = b""
    for chunk in chunks:
        data = held + chunk
        cut = len(data) - len(data) % 2
        held = data[cut:]
        if cut:
            yield data[:cut]
    if held:
        log.warning("the voice's pcm ended mid-sample: its last byte dropped")


def _refusal_text(response: httpx.Response) -> str:
    body = b""
    for part in response.iter_bytes():
        body += part
        if len(body) >= MAX_ERROR_BYTES:
            break
    response.close()
    return body[:MAX_ERROR_BYTES].decode("utf-8", "replace").strip()
