"""duplex-client talk / resume-test / trace, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import wave

from clients.duplex.wav import write_pcm16_wav
from tests.conftest import free_port
from tests.e2e.serverproc import ServerProcess, run_cli
from tests.wsclient import tone_pcm16


def client_cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("clients.duplex.cli", *args)


def test_talk_resume_test_and_trace(tmp_path):
    question = tmp_path / "q.wav"
    write_pcm16_wav(str(question), tone_pcm16(500, rate=16000), 16000)
    server = ServerProcess("memory").start()
    try:
        url = f"ws://127.0.0.1:{server.port}/v1/duplex"
        answer, trace = tmp_path / "a.wav", tmp_path / "t.json"
        talk = client_cli(
            "talk", str(question), "--url", url, "--out", str(answer), "--trace", str(trace)
        )
        assert talk.returncode == 0, talk.stderr
        assert "completed" in talk.stdout and "first audio after commit" in talk.stdout
        assert "streaming 0.5s / 0.5s" in talk.stderr  # the progress line
        with wave.open(str(answer)) as reader:
            assert reader.getframerate() == 16000
            assert reader.getnframes() == 8000  # the echo of 0.5 s
        frames = json.loads(trace.read_text())["frames"]
        assert frames[0]["dir"] == "out" and frames[0]["type"] == "session.update"
        shown = client_cli("trace", str(trace))
        assert shown.returncode == 0 and f"{len(frames)} frames" in shown.stdout
        resume = client_cli("resume-test", str(question), "--url", url, "--chunk-delay-ms", "30")
        assert resume.returncode == 0, resume.stderr
        assert "resumed in" in resume.stdout
        assert "duplicates: 0, out of order: 0" in resume.stdout
    finally:
        server.stop()


def test_clear_errors(tmp_path):
    missing = client_cli("talk", str(tmp_path / "none.wav"))
    assert missing.returncode != 0 and "duplex-client:" in missing.stderr
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(b"\x00" * 400)
    refused = client_cli("talk", str(stereo))
    assert refused.returncode != 0 and "need mono 16-bit PCM" in refused.stderr
    mono = tmp_path / "mono.wav"
    write_pcm16_wav(str(mono), tone_pcm16(100, rate=16000), 16000)
    nobody = client_cli("talk", str(mono), "--url", f"ws://127.0.0.1:{free_port()}/v1/duplex")
    assert nobody.returncode != 0 and "cannot connect" in nobody.stderr
    assert "Traceback" not in nobody.stderr
