"""What ``--asr-url`` and ``--tts-url`` send and how they read the answer,
against a real HTTP server on a local port (the stdlib's, so it can also
misbehave as a remote does: close a connection without an answer, break
off mid-body): the transcription's multipart form and WAV file, a streamed
transcript, the pcm stream cut mid-sample, the retry policy (only while no
answer came), the probe ``/ready`` asks, and the start-up refusals."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from duplex_server import cli
from duplex_server.app import create_app
from duplex_server.engine.audio.remote_speech import (
    RemoteRecogniser,
    RemoteRefusal,
    RemoteSpeechError,
    RemoteSpeechOptions,
    RemoteSynthesiser,
    pcm16_pieces,
    transcript_of_events,
)
from duplex_server.models.cascade.model import VOICES


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


# An answer: what the handler does with one request (write a response, or not).
Answer = Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Remote:
    """A scripted remote: each request gets the next answer (the last repeats)."""

    answers: list[Answer]
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length)
        self.seen.append(
            Seen(
                handler.command,
                handler.path,
                {k.lower(): v for k, v in handler.headers.items()},
                body,
            )
        )
        index = min(len(self.seen), len(self.answers)) - 1
        self.answers[index](handler)


@contextlib.contextmanager
def serving(*answers: Answer) -> Iterator[Remote]:
    remote = Remote(list(answers))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept alive, chunked answers

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            remote.answer(self)

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    remote.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield remote
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def whole(status: int, body: bytes, media: str = "application/json") -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("content-type", media)
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def chunked(pieces: list[bytes], media: str, finish: bool = True) -> Answer:
    """A 200 sent in these chunks; ``finish=False``: the connection drops after them."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", media)
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        for piece in pieces:
            handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            handler.wfile.flush()
        if finish:
            handler.wfile.write(b"0\r\n\r\n")
        else:
            handler.close_connection = True

    return answer


def hang_up(handler: BaseHTTPRequestHandler) -> None:
    """The connection closed with no status line: the request got no answer."""
    handler.close_connection = True


def options(remote: Remote, **more: object) -> RemoteSpeechOptions:
    fields: dict = {"api_key": "sk-remote", "retries": 2, "timeout_s": 10.0, **more}
    return RemoteSpeechOptions(remote.url, fields.pop("model", "whisper-1"), **fields)


def form(seen: Seen) -> dict[str, tuple[str | None, bytes]]:
    """The multipart body's parts: name -> (file name, bytes)."""
    head = f"content-type: {seen.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + seen.body)
    parts = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        parts[name] = (part.get_filename(), part.get_payload(decode=True))
    return parts


def sse(*events: dict) -> list[bytes]:
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events]


PCM = bytes(range(256)) * 40  # 10,240 bytes: 5,120 samples


def test_a_turn_goes_as_a_multipart_wav_with_the_model_and_hints():
    with serving(whole(200, b'{"text": " turn on the lights "}')) as remote:
        asr = RemoteRecogniser(options(remote))
        assert asr.transcribe(PCM, "en", "lights") == "turn on the lights"
    (seen,) = remote.seen
    assert (seen.method, seen.path) == ("POST", "/v1/audio/transcriptions")
    assert seen.headers["authorization"] == "Bearer sk-remote"
    parts = form(seen)
    assert {name: value for name, (_, value) in parts.items() if name != "file"} == {
        "model": b"whisper-1",
        "response_format": b"json",
        "stream": b"true",
        "language": b"en",
        "prompt": b"lights",
    }
    filename, data = parts["file"]
    assert filename == "turn.wav"
    with wave.open(io.BytesIO(data)) as file:
        assert (file.getnchannels(), file.getsampwidth(), file.getframerate()) == (1, 2, 16_000)
        assert file.readframes(file.getnframes()) == PCM


def test_no_hints_no_fields():
    with serving(whole(200, b"heard\n", "text/plain")) as remote:
        assert RemoteRecogniser(options(remote)).transcribe(PCM, None, None) == "heard"
    assert set(form(remote.seen[0])) == {"model", "response_format", "stream", "file"}


def test_a_streamed_transcript_is_read_to_its_done():
    events = sse(
        {"type": "transcript.text.delta", "delta": "turn on"},
        {"type": "transcript.text.delta", "delta": " the lights"},
        {"type": "transcript.text.done", "text": "turn on the lights"},
    )
    # the events split across chunks anywhere, even mid-line
    joined = b"".join(events)
    pieces = [joined[:7], joined[7:50], joined[50:]]
    with serving(chunked(pieces, "text/event-stream")) as remote:
        assert RemoteRecogniser(options(remote)).transcribe(PCM, None, None) == (
            "turn on the lights"
        )


def test_a_stream_that_breaks_off_or_errs_fails_the_turn():
    delta = {"type": "transcript.text.delta", "delta": "turn on"}
    with pytest.raises(RemoteSpeechError, match="before its text was done"):
        transcript_of_events(["data: " + json.dumps(delta), ""], "http://x/v1")
    with pytest.raises(RemoteSpeechError, match="failed"):
        transcript_of_events(['data: {"type": "error", "error": {"message": "x"}}'], "http://x")


def test_a_remote_that_takes_no_stream_is_asked_again_without_it_and_never_after():
    refusal = whole(400, b'{"error": {"message": "stream is not supported for this model"}}')
    answer = whole(200, b'{"text": "good morning"}')
    with serving(refusal, answer, answer) as remote:
        asr = RemoteRecogniser(options(remote))
        assert asr.transcribe(PCM, None, None) == "good morning"
        assert asr.transcribe(PCM, None, None) == "good morning"
    assert ["stream" in form(seen) for seen in remote.seen] == [True, False, False]


def test_another_refusal_fails_the_turn_by_its_status_and_text():
    refusal = whole(404, b'{"error": "model whisper-9 not found"}')
    with (
        serving(refusal) as remote,
        pytest.raises(RemoteRefusal, match=r"404: .*whisper-9 not found") as refused,
    ):
        RemoteRecogniser(options(remote, model="whisper-9")).transcribe(PCM, None, None)
    assert refused.value.status == 404
    assert len(remote.seen) == 1  # not tried again


def test_speech_is_asked_for_as_pcm_and_read_across_chunks_cut_mid_sample():
    pieces = [PCM[:1], PCM[1:1001], PCM[1001:4000], PCM[4000:]]  # odd cuts
    with serving(chunked(pieces, "audio/pcm")) as remote:
        tts = RemoteSynthesiser(options(remote, model="tts-1"), VOICES)
        assert tts.synthesize("Good morning.", VOICES["coral"], 1.25) == PCM
    (seen,) = remote.seen
    assert (seen.method, seen.path) == ("POST", "/v1/audio/speech")
    assert seen.headers["authorization"] == "Bearer sk-remote"
    # the cascade's eSpeak name for coral goes back as coral
    assert json.loads(seen.body) == {
        "model": "tts-1",
        "input": "Good morning.",
        "voice": "coral",
        "response_format": "pcm",
        "speed": 1.25,
    }


def test_any_voice_is_passed_through():
    tts = RemoteSynthesiser(RemoteSpeechOptions("http://x/v1", "kokoro"), VOICES)
    assert tts.knows_voice("af_bella")
    assert tts.voice_of("af_bella") == "af_bella"
    assert tts.voice_of(VOICES["default"]) == "alloy"  # default and alloy: one voice


def test_pcm_pieces_are_whole_samples():
    pieces = list(pcm16_pieces([b"\x01", b"\x02\x03", b"", b"\x04\x05\x06"]))
    assert pieces == [b"\x01\x02", b"\x03\x04\x05\x06"]
    assert b"".join(pcm16_pieces([b"\x01\x02\x03"])) == b"\x01\x02"  # a stray last byte


def test_a_request_with_no_answer_is_tried_again():
    # hung up on twice (a kept-alive connection closed, a restart), then a 503, then heard
    script = [hang_up, hang_up, whole(503, b"busy"), whole(200, b'{"text": "open the door"}')]
    with serving(*script) as remote:
        asr = RemoteRecogniser(options(remote, retries=3))
        assert asr.transcribe(PCM, None, None) == "open the door"
    assert len(remote.seen) == 4
    assert asr.remote.retried == 3


def test_retries_run_out():
    with serving(whole(503, b"busy")) as remote, pytest.raises(RemoteRefusal, match="503: busy"):
        RemoteRecogniser(options(remote, retries=1)).transcribe(PCM, None, None)
    assert len(remote.seen) == 2


def test_nothing_listening_does_not_answer():
    with serving(hang_up) as remote:
        url = remote.url
    asr = RemoteRecogniser(RemoteSpeechOptions(url, "whisper-1", retries=1))
    with pytest.raises(RemoteSpeechError, match="does not answer"):
        asr.transcribe(PCM, None, None)
    assert asr.remote.retried == 1


def test_audio_that_breaks_off_is_never_asked_for_again():
    with serving(chunked([PCM[:1000]], "audio/pcm", finish=False)) as remote:
        tts = RemoteSynthesiser(options(remote, retries=3), VOICES)
        with pytest.raises(RemoteSpeechError, match="mid-answer"):
            tts.synthesize("Good morning.", "alloy", 1.0)
    assert len(remote.seen) == 1
    assert tts.remote.retried == 0


async def test_the_probe_says_whether_the_remote_answers():
    with serving(whole(200, b'{"data": []}')) as remote:
        tts = RemoteSynthesiser(options(remote), VOICES)
        assert await tts.remote.unreachable() is None
        assert remote.seen[0].path == "/v1/models"
        assert remote.seen[0].headers["authorization"] == "Bearer sk-remote"
    with serving(whole(404, b"no such route")) as remote:  # it answers: up
        assert await RemoteSynthesiser(options(remote), VOICES).remote.unreachable() is None
    with serving(whole(401, b"bad key")) as remote:
        why = await RemoteRecogniser(options(remote)).remote.unreachable()
        assert why is not None and "401" in why
    asr = RemoteRecogniser(RemoteSpeechOptions(remote.url, "whisper-1"))  # stopped now
    why = await asr.remote.unreachable()
    assert why is not None and "does not answer" in why


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--asr-url", "127.0.0.1:1"], "--asr-url 127.0.0.1:1: give an http:// or https://"),
        (["--tts-url", "ftp://x/v1"], "--tts-url ftp://x/v1: give an http://"),
        (["--asr-url", "http://x/v1", "--asr", "pocketsphinx"], "--asr pocketsphinx and --asr-url"),
        (["--tts-url", "http://x/v1", "--tts", "piper"], "--tts piper and --tts-url"),
        (["--asr-url", "http://x/v1", "--asr-phrases", __file__], "not with --asr-url"),
        (["--asr-url", "http://x/v1", "--model", "echo"], "--asr-url is the cascade's"),
        (["--tts-url", "http://x/v1", "--model", "scripted"], "--tts-url is the cascade's"),
    ],
)
def test_a_remote_named_wrongly_is_refused_at_start(flags, refusal):
    config = cli.serve_config(flags, {})
    with pytest.raises(ValueError, match=refusal):
        create_app(config)


def test_the_key_comes_from_the_environment():
    config = cli.serve_config(["--asr-url", "http://x/v1"], {"DUPLEX_SERVER_SPEECH_API_KEY": "k1"})
    assert config.speech_api_key == "k1"
