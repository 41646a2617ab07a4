"""``duplex-client``: talk to a server from a WAV file, test resume, read traces."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import websockets

from clients.duplex.client import DuplexClient, ReconnectPolicy
from clients.duplex.collector import EventCollector
from clients.duplex.demux import ConnectionResumed
from clients.duplex.errors import DuplexClientError
from clients.duplex.trace import DuplexTrace
from clients.duplex.wav import read_pcm16_wav, write_pcm16_wav
from protocol import server_events as se
from protocol.session_config import ExtraBody, SessionUpdate


class StatusLine:
    """One self-overwriting line on a terminal, plain lines otherwise."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _client(args: argparse.Namespace, rate: int, **options) -> DuplexClient:
    """A client for the CLI's options, with pcm16 both ways at the file's rate."""
    return DuplexClient(
        args.url,
        model=args.model,
        api_key=args.api_key,
        config=_config(rate, args.chunk_delay_ms),
        **options,
    )


def _config(rate: int, chunk_delay_ms: float) -> SessionUpdate:
    return SessionUpdate(
        input_audio_format="pcm16",
        input_sample_rate_hz=rate,
        output_audio_format="pcm16",
        output_sample_rate_hz=rate,
        extra_body=ExtraBody(chunk_delay_ms=chunk_delay_ms),
    )


async def talk(args: argparse.Namespace) -> int:
    pcm, rate = read_pcm16_wav(args.wav)
    status = StatusLine()
    trace = DuplexTrace() if args.trace else None
    collector = EventCollector()
    async with _client(args, rate, trace=trace) as client:
        client.add_listener(collector.add)
        chunk_ms = 100
        step = rate * chunk_ms // 1000 * 2
        for sent, offset in enumerate(range(0, len(pcm), step), start=1):
            await client.append_audio(pcm[offset : offset + step])
            status.show(f"streaming {sent * chunk_ms / 1000:.1f}s / {len(pcm) / 2 / rate:.1f}s")
            if args.realtime:
                await asyncio.sleep(chunk_ms / 1000)
        collector.mark_sent("commit")
        await client.commit()
        answers = []
        async for response in client.responses(timeout_s=args.timeout):
            async for _chunk in response.audio(timeout_s=args.timeout):
                status.show(f"answer {response.response_id}: {len(response.audio_bytes)} bytes")
            await response.wait(args.timeout)
            answers.append(response)
            break
        status.done()
    for index, response in enumerate(answers):
        out = args.out if len(answers) == 1 else args.out.replace(".wav", f"-{index}.wav")
        write_pcm16_wav(out, response.audio_bytes, rate)
        print(
            f"response {response.response_id}: {response.status}, "
            f"{len(response.audio_bytes) / 2 / rate:.2f} s -> {out}"
        )
        print(f"transcript: {response.transcript!r}")
    summary = collector.timing_summary()
    print(
        f"first audio after commit: {summary['first_audio_ms']} ms; "
        f"audio cadence: {summary['audio_cadence_ms']}"
    )
    if trace is not None:
        trace.save(args.trace)
    return 0


async def resume_test(args: argparse.Namespace) -> int:
    """Drop the socket mid-answer on purpose and show the session resuming."""
    pcm, rate = read_pcm16_wav(args.wav)
    policy = ReconnectPolicy(initial_backoff_s=0.05)
    async with _client(args, rate, reconnect=policy) as client:
        await client.append_audio(pcm)
        await client.commit()
        seqs: list[int] = []
        dropped = False
        started = time.monotonic()
        async for event in client.events(timeout_s=args.timeout):
            seq = getattr(event, "server_event_seq", None)
            if seq:
                seqs.append(seq)
            if isinstance(event, se.OutputAudioDelta) and not dropped:
                dropped = True
                print(f"dropping the socket after event #{seq}")
                # connected (it just received an event), on the default websocket
                assert isinstance(client._ws, websockets.ClientConnection)
                client._ws.transport.abort()
            elif isinstance(event, ConnectionResumed):
                print(
                    f"resumed in {1000 * (time.monotonic() - started):.0f} ms: generation "
                    f"{event.attachment_generation}, replay #{event.replay_from_seq}.."
                    f"#{event.replay_to_seq}"
                )
            elif isinstance(event, se.ResponseDone):
                break
        backwards = sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a)
        duplicates = len(seqs) - len(set(seqs))
        print(f"events: {len(seqs)}, duplicates: {duplicates}, out of order: {backwards}")
        return 0 if duplicates == 0 and seqs == sorted(seqs) else 1


def show_trace(args: argparse.Namespace) -> int:
    with open(args.file) as handle:
        frames = json.load(handle)["frames"]
    for frame in frames:
        print(f"{frame['t_s']:10.4f}  {frame['dir']:3}  {frame['bytes']:7}  {frame['type']}")
    print(f"{len(frames)} frames")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="duplex-client", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("talk", "stream a WAV question, save each answer as WAV"),
        ("resume-test", "drop the socket mid-answer and show the resume"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("wav", help="mono 16-bit PCM WAV file")
        p.add_argument("--url", default="ws://127.0.0.1:8000/v1/duplex")
        p.add_argument("--model", default=None)
        p.add_argument("--api-key", default=None)
        p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for events")
        p.add_argument(
            "--chunk-delay-ms",
            type=float,
            default=0.0,
            help="echo model: pace the answer (extra_body.chunk_delay_ms)",
        )
        if name == "talk":
            p.add_argument("--out", default="answer.wav", help="where to write the answer")
            p.add_argument("--realtime", action="store_true", help="pace input like a microphone")
            p.add_argument("--trace", default=None, help="save the wire trace as JSON here")
    p = sub.add_parser("trace", help="print a saved wire trace")
    p.add_argument("file")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        if args.command == "talk":
            code = asyncio.run(talk(args))
        elif args.command == "resume-test":
            code = asyncio.run(resume_test(args))
        else:
            code = show_trace(args)
    except (DuplexClientError, TimeoutError, OSError, ValueError) as exc:
        sys.exit(f"duplex-client: {exc}")
    sys.exit(code)


if __name__ == "__main__":
    main()
