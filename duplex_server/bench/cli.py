"""``duplex-server bench ...`` argument parsing; the benchmarks live beside it."""

from __future__ import annotations

import argparse


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="run a benchmark and print one JSON line")
    kinds = bench.add_subparsers(dest="bench", required=True)
    p = kinds.add_parser(
        "sessions",
        help="N echo sessions streaming audio against one server",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sessions", type=int, default=100, help="concurrent client sessions")
    p.add_argument("--seconds", type=float, default=10.0, help="measured duration")
    p.add_argument("--chunk-ms", type=int, default=100, help="audio per append (and period)")
    p.add_argument("--commit-every-s", type=float, default=2.0, help="commit period")
    p.add_argument(
        "--store",
        default="memory",
        help="server --store: memory, or sqlite:PATH (then memory runs too, for ratios)",
    )
    p.add_argument("--port", type=int, default=0, help="server port (0 = a free one)")
    p.add_argument("--ramp-s", type=float, default=5.0, help="spread session starts over this")
    p.set_defaults(run=_run_sessions)
    _add_recovery(kinds)
    _add_client(kinds)


def _add_recovery(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "recovery",
        help="time the restart recovery of a SQLite store",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--sessions", type=int, default=1000, help="open sessions in the store")
    p.add_argument("--records", type=int, default=200, help="log records per session")
    p.add_argument("--path", default=None, help="where to build the store (default: a temp dir)")
    p.set_defaults(run=_run_recovery)


def _add_client(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser(
        "client",
        help="DuplexClient's cost per event against a raw socket",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--count", type=int, default=500, help="round trips per round and path")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    p.set_defaults(run=_run_client)


def _run_client(args: argparse.Namespace) -> None:
    from duplex_server.bench.client_overhead import run

    run(args)


def _run_recovery(args: argparse.Namespace) -> None:
    from duplex_server.bench.recovery import run

    run(args)


def _run_sessions(args: argparse.Namespace) -> None:
    from duplex_server.bench.sessions import run

    run(args)
