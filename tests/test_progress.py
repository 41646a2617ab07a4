"""Progress on stderr: a bench draws tqdm bars where stderr is a terminal (a
pty here), and draws nothing where it is not (a pipe) or with ``--quiet``;
stdout is the same one JSON line in every case. The server's model loads
draw a bar on a terminal and nothing elsewhere, nor with ``serve --quiet``."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from duplex_server import progress

REPO = Path(__file__).resolve().parents[1]
SOAK = [
    "soak",
    "--store",
    "memory",
    "--sessions",
    "20",
    "--churn-clients",
    "2",
    "--streaming",
    "1",
    "--sample-s",
    "0.5",
    "--churn-audio-ms",
    "200",
]
CHAOS = [
    "chaos",
    "--deployment",
    "sqlite",
    "--clients",
    "2",
    "--faults",
    "1",
    "--warmup-s",
    "0.5",
    "--min-gap-s",
    "0.1",
    "--max-gap-s",
    "0.2",
    "--min-hold-s",
    "0.1",
    "--max-hold-s",
    "0.2",
    "--settle-s",
    "0.5",
]
# a bench with no bar of its own: the time it has run
SESSIONS = ["sessions", "--store", "memory", "--sessions", "2", "--seconds", "1", "--ramp-s", "0"]
# what tqdm draws: "soak:  45%|████▌     | 9/20 [...]" or "chaos sqlite: 100%|...| 1/1 [...]",
# and for the others "bench sessions: 00:03 elapsed"
BAR = r"{}: +\d+%\|.*\| *\d+/\d+ \["
ELAPSED = r"{}: \d\d:\d\d elapsed"


def terminal() -> tuple[int, int]:
    """A pty (master, slave) of a terminal's size (a new one has 0 columns)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    return master, slave


def bench(argv: list[str], *, tty: bool) -> tuple[str, str]:
    """(stdout, stderr) of ``duplex-server bench ARGV``; stderr a pty if ``tty``."""
    command = [sys.executable, "-m", "duplex_server.cli", "bench", *argv]
    if not tty:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
        return done.stdout, done.stderr
    return on_terminal(command)


def on_terminal(command: list[str], until: str | None = None) -> tuple[str, str]:
    """(stdout, stderr) of ``command`` run with stderr on a pty: to its end, or
    (a server) until its stderr shows ``until``, when it is stopped."""
    master, slave = terminal()
    drawn = bytearray()
    seen = threading.Event()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every end of the pty's other side is closed
                return
            if not chunk:
                return
            drawn.extend(chunk)
            if until is not None and until.encode() in drawn:
                seen.set()

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        with subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=slave, text=True
        ) as process:
            os.close(slave)
            if until is not None:
                while not seen.wait(0.2):
                    assert process.poll() is None, drawn.decode(errors="replace")
                process.terminate()
            stdout, _ = process.communicate()
        # uvicorn stops on SIGTERM, then raises it again for its parent to see
        assert process.returncode == (0 if until is None else -signal.SIGTERM)
        reader.join()
    finally:
        os.close(master)
    return stdout, drawn.decode(errors="replace")


def one_json_line(stdout: str) -> dict:
    lines = stdout.splitlines()
    assert len(lines) == 1, lines
    return json.loads(lines[0])


@pytest.mark.parametrize(
    ("argv", "drawing"),
    [
        (SOAK, BAR.format("soak")),
        (CHAOS, BAR.format("chaos sqlite")),
        (SESSIONS, ELAPSED.format("bench sessions")),
    ],
)
def test_a_bench_draws_progress_on_a_terminal_only(argv, drawing):
    drawn_out, drawn = bench(argv, tty=True)
    piped_out, piped = bench(argv, tty=False)
    quiet_out, quiet = bench([*argv, "--quiet"], tty=True)

    assert re.search(drawing, drawn), drawn
    assert piped == "" and quiet == ""
    results = [one_json_line(out) for out in (drawn_out, piped_out, quiet_out)]
    assert {result["bench"] for result in results} == {argv[0]}
    # the same report each time (its figures are measurements and differ)
    assert results[0].keys() == results[1].keys() == results[2].keys()
    assert all(result["valid"] for result in results)


def test_model_loads_draw_nothing_where_stderr_is_not_a_terminal(capsys):
    with progress.loads("loading", 2) as loading:
        assert loading.load("one", lambda x: x + 1, 1) == 2
        assert loading.load("two", str, 3) == "3"
    progress.watch("waiting", lambda: True)
    assert capsys.readouterr().err == ""


def test_model_loads_draw_a_bar_on_a_terminal(monkeypatch):
    master, slave = terminal()
    drawn = b""
    try:
        with os.fdopen(slave, "w", closefd=False) as stderr:
            monkeypatch.setattr(sys, "stderr", stderr)
            with progress.loads("loading the cascade", 2) as loading:
                loading.load("recogniser", int, "1")
                loading.load("voice", int, "2")
            stderr.write("END\n")  # read up to here
            stderr.flush()
        while b"END" not in drawn:
            drawn += os.read(master, 4096)
    finally:
        os.close(slave)
        os.close(master)
    # drawn when it begins (loads this quick are not redrawn) and cleared at the end
    assert re.search(r"loading the cascade: +0%\|.*\| *0/2 \[", drawn.decode()), drawn


def test_serve_draws_its_model_loads_on_a_terminal_unless_quiet():
    """The cascade's loads (recogniser, voice, voice activity) on the server's
    own stderr, then its first log line once it listens."""
    port = ["--port", "0", "--log-level", "info", "--store", "memory"]
    serve = [sys.executable, "-m", "duplex_server.cli", "serve", *port]
    listening = "Uvicorn running on"
    _, drawn = on_terminal(serve, until=listening)
    _, quiet = on_terminal([*serve, "--quiet"], until=listening)

    assert re.search(r"loading the cascade: +0%\|.*\| *0/3 \[", drawn), drawn
    assert "loading the cascade" not in quiet, quiet
    assert listening in quiet
