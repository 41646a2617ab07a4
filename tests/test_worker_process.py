"""PocketSphinx behind its worker process: the same words as in-process,
decoded in another process, and no worker outlives a server killed with
``kill -9``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from duplex_server.engine.audio.sphinx import Sphinx, SphinxWorker
from tests.speech import PHRASES, speak

CHILD = """
import json, sys
import psutil
from duplex_server.engine.audio.sphinx import SphinxWorker
worker = SphinxWorker(None)
worker.transcribe(b"\\0\\0" * 16000)  # the worker is up and has decoded
print(json.dumps([child.pid for child in psutil.Process().children()]), flush=True)
sys.stdin.read()  # until killed
"""


def test_the_worker_hears_what_the_decoder_hears():
    speech = speak(PHRASES[1], 16_000)
    assert SphinxWorker(PHRASES).transcribe(speech) == Sphinx(PHRASES).transcribe(speech)
    assert SphinxWorker(PHRASES).transcribe(b"") == ""


def test_decoding_runs_in_another_process():
    worker = SphinxWorker(PHRASES)
    worker.transcribe(speak(PHRASES[0], 16_000))
    children = psutil.Process().children(recursive=True)
    assert any("spawn_main" in " ".join(child.cmdline()) for child in children)
    assert all(child.pid != os.getpid() for child in children)


def test_no_worker_outlives_a_killed_server():
    server = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    workers = json.loads(server.stdout.readline())
    assert workers, "the server started its worker"
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    deadline = time.monotonic() + 30  # a wait for the watchdog, not a speed check
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in workers if _running(pid)]
    assert alive == [], f"orphaned workers still running: {alive}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
