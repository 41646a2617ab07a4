"""``duplex-server``: serve, and benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import os
import sys
from collections.abc import Mapping

from duplex_server import config_sources, settings
from duplex_server.config import ServerConfig
from duplex_server.models import MODEL_NAMES


def _version() -> str:
    return f"%(prog)s {importlib.metadata.version('duplex-server')}"


def _add_serve(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``serve``: its options are ServerConfig's declared settings, in their groups."""
    p = sub.add_parser(
        "serve",
        help="run the realtime server",
        usage="%(prog)s [--config FILE] [OPTION ...]",  # the groups below list them
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Every option is also read from the environment variable "
        f"{settings.ENV_PREFIX}<OPTION> (--max-sessions: "
        f"{settings.env_name('max_sessions')}) and from the --config file "
        "(max_sessions = 100); a flag wins over the environment, the environment over "
        "the file, the file over the default. Reference: docs/reference/options.md.",
    )
    p.add_argument("--version", action="version", version=_version())
    p.add_argument(
        "--config",
        default=None,
        help="a TOML file of serve options, keys spelled like the options "
        f"(max_sessions = 100); also {settings.env_name(config_sources.CONFIG_OPTION)}",
    )
    settings.add_arguments(p, settings.options(ServerConfig))
    return p


def _add_options(sub: argparse._SubParsersAction) -> None:
    options = sub.add_parser("options", help="print the serve options reference")
    options.add_argument(
        "--markdown",
        action="store_true",
        help="as docs/reference/options.md (the default; the flag names the format)",
    )
    options.add_argument(
        "--write",
        action="store_true",
        help=f"write it to {settings.DOCS_PATH} (run from the checkout) instead of printing it",
    )
    options.set_defaults(run=_print_or_write_options)


def _print_or_write_options(args: argparse.Namespace) -> None:
    text = _options_reference()
    if args.write:
        settings.DOCS_PATH.parent.mkdir(parents=True, exist_ok=True)
        settings.DOCS_PATH.write_text(text)
    else:
        print(text, end="")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    """``bench``: listed here, parsed by duplex_bench; :func:`main` hands ``bench
    ARGV`` over before parsing, since argparse cannot pass ``--help`` through."""
    bench = sub.add_parser(
        "bench", help="run a benchmark and print one JSON line (also duplex-bench)", add_help=False
    )
    bench.add_argument("bench_argv", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_argv))


def _bench(argv: list[str]) -> None:
    """The bench is its own package; imported only when ``bench`` is the command,
    so ``serve`` never loads it (and the product never depends on it)."""
    from duplex_bench.cli import main as bench_main

    bench_main(argv, prog="duplex-server bench")


def _options_reference() -> str:
    return settings.markdown(settings.options(ServerConfig))


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _config(args: argparse.Namespace) -> ServerConfig:
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        raise SystemExit("duplex-server: --ssl-certfile and --ssl-keyfile go together")
    # Each serve option is the ServerConfig field of its name (declared there).
    fields = {field.name for field in dataclasses.fields(ServerConfig)}
    return ServerConfig(**{name: value for name, value in vars(args).items() if name in fields})


def _tune_gc() -> None:
    """Keep cyclic-GC pauses out of the latency tail.

    A busy server allocates many short-lived objects and few cycles; with
    CPython's default thresholds, full collections over a large heap showed
    up as tens of milliseconds of p99 (``duplex-server bench sessions``).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def serve(config: ServerConfig) -> None:
    import uvicorn

    from duplex_server import log_format, progress, redaction
    from duplex_server.app import create_app
    from duplex_server.sessions.log.sqlite_store import StoreError
    from duplex_server.transport import uvicorn_config

    progress.set_quiet(config.quiet)
    try:
        app = create_app(config)
    except (ValueError, StoreError) as exc:
        sys.exit(f"duplex-server: {redaction.redact(str(exc))}")
    log_format.configure(config.log_level)
    _tune_gc()
    server = uvicorn.Server(uvicorn_config(app, config))
    log_format.install(config.log_format)  # after uvicorn configured its loggers
    redaction.install()
    server.run()


def _add_audit(sub: argparse._SubParsersAction) -> None:
    inspect = sub.add_parser("inspect", help="list a store's sessions, or print one's log")
    inspect.add_argument("path", help="SQLite session database (the PATH of --store sqlite:PATH)")
    inspect.add_argument("session", nargs="?", help="session id: print its log")
    replay = sub.add_parser("replay", help="refold a session's log and print the state")
    replay.add_argument("path", help="SQLite session database")
    replay.add_argument("session", help="session id")
    replay.add_argument("--model", default="echo", choices=MODEL_NAMES)


def _add_keys(sub: argparse._SubParsersAction) -> None:
    keys = sub.add_parser("keys", help="manage the API keys of --api-keys-file")
    actions = keys.add_subparsers(dest="keys_action", required=True)
    add = actions.add_parser("add", help="make a key, print it once, store only its hash")
    add.add_argument("path", help="the keys file (created if missing)")
    add.add_argument("name", help="the key's principal: the sessions it opens are its")
    add.add_argument(
        "--scopes",
        type=_names,
        default=["realtime"],
        help="realtime, batch, admin (comma-separated)",
    )
    add.add_argument(
        "--max-sessions", type=int, default=0, help="live sessions it may hold (0: no quota)"
    )


def _keys(args: argparse.Namespace) -> None:
    from duplex_server.auth import new_key_entry

    try:
        key, line = new_key_entry(args.name, args.scopes, args.max_sessions)
    except ValueError as exc:
        sys.exit(f"duplex-server: {exc}")
    # Readable by its owner only: hashes, but also names and quotas.
    with os.fdopen(os.open(args.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a") as out:
        out.write(line + "\n")
    print(key)


def _audit(args: argparse.Namespace) -> None:
    from duplex_server import audit
    from duplex_server.sessions.log.sqlite_store import SqliteReader, StoreError
    from duplex_server.sessions.log.store import StorageUnavailable, UnknownSession

    try:
        reader = SqliteReader(args.path)
        if reader.media_location is not None:  # its audio sealed out into segments
            from duplex_server.app import open_media

            reader.open_media(open_media(reader.media_location))
        if args.command == "replay":
            print(audit.replay_state(reader, args.session, args.model))
        elif args.session:
            print("\n".join(audit.show_log(reader, args.session)))
        else:
            print("\n".join(audit.list_sessions(reader)))
    except (StoreError, StorageUnavailable, ValueError) as exc:  # ValueError: media unreachable
        sys.exit(f"duplex-server: {exc}")
    except UnknownSession:
        sys.exit(f"duplex-server: no session {args.session} in {args.path}")


def parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line, and its ``serve`` part."""
    parser = argparse.ArgumentParser(prog="duplex-server", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = _add_serve(sub)
    _add_options(sub)
    _add_audit(sub)
    _add_keys(sub)
    _add_bench(sub)
    return parser, serve_parser


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> argparse.Namespace:
    """The command line; for ``serve``, what no flag gives comes from the
    environment, then from the ``--config`` file, then the defaults."""
    parser, serve_parser = parsers()
    args = parser.parse_args(argv)
    if args.command != "serve":
        return args
    try:
        layered = config_sources.layered_defaults(serve_parser, args.config, environ)
    except config_sources.ConfigSourceError as exc:
        raise SystemExit(f"duplex-server: {exc}") from None
    serve_parser.set_defaults(**layered)
    return parser.parse_args(argv)  # again: now flags win over those defaults


def serve_config(argv: list[str], environ: Mapping[str, str]) -> ServerConfig:
    """What ``duplex-server serve ARGV`` would serve with, in ``environ``."""
    return _config(parse_args(["serve", *argv], environ))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        _bench(argv[1:])
        return
    args = parse_args(argv, os.environ)
    if args.command == "serve":
        serve(_config(args))
    elif args.command in ("inspect", "replay"):
        _audit(args)
    elif args.command == "keys":
        _keys(args)
    else:
        args.run(args)


if __name__ == "__main__":
    main()
