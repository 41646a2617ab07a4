"""scripts/install, the one the Dockerfile runs, installs a server that
serves offline: the project's wheel with one ``pip install '<wheel>[voice,…]'``,
every model file from a declared dependency, and ``pip check`` clean.

No container engine or base image can be fetched here, so this runs what
the image's build runs: the install script, into a fresh directory, with no
package index (``--wheelhouse``: pip ``--no-index``, and every proxy variable
pointing at a closed port), then starts ``duplex-server serve`` from that
directory with the embedded default model and opens a session on it.

The wheelhouse is filled once (``--fill-wheelhouse``, the only step that
needs the package index) and kept in this virtual environment, named by a
digest of what decides its contents: the project's dependencies and the
script. Later runs need no network at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

from duplex_bench import server_process
from tests.speech import silence, speak
from tests.wsclient import WsClient

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install"
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens
INSTALL_TIMEOUT_S = 300


def wheelhouse() -> Path:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    key = (
        json.dumps(
            [
                project["project"]["dependencies"],
                project["project"]["optional-dependencies"]["voice"],
                project["build-system"]["requires"],
            ]
        ).encode()
        + SCRIPT.read_bytes()
    )
    path = Path(sys.prefix) / f"wheelhouse-{hashlib.sha256(key).hexdigest()[:12]}"
    if not path.is_dir():
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        run_script("--fill-wheelhouse", str(partial), env=os.environ | {"PYTHON": sys.executable})
        for stale in path.parent.glob("wheelhouse-*"):  # for other dependencies, or half full
            if stale != partial:
                shutil.rmtree(stale)
        partial.rename(path)
    return path


def offline_environ() -> dict[str, str]:
    """This environment with no way out: a package index or any download
    through a proxy fails at once; loopback still connects."""
    proxies = ("http_proxy", "https_proxy", "all_proxy")
    return os.environ | {
        **{name: CLOSED for name in proxies},
        **{name.upper(): CLOSED for name in proxies},
        "no_proxy": "127.0.0.1,localhost",
        "NO_PROXY": "127.0.0.1,localhost",
        "PIP_INDEX_URL": CLOSED,
        "HF_HUB_OFFLINE": "1",
    }


def run_script(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
    )
    assert done.returncode == 0, f"scripts/install {' '.join(args)}:\n{done.stderr[-4000:]}"


class InstalledServer(server_process.ServerProcess):
    """The tests' server helper, running the installed entry point."""

    def __init__(self, target: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target = target

    def command(self) -> list[str]:
        argv = super().command()
        assert argv[:3] == [sys.executable, "-m", "duplex_server.cli"]
        return [str(self.target / "bin" / "duplex-server"), *argv[3:]]


def test_install_script_installs_a_server_that_serves_offline(tmp_path, monkeypatch):
    wheels = wheelhouse()  # before going offline: the first run fills it
    for name, value in offline_environ().items():
        monkeypatch.setenv(name, value)  # the server too runs without a way out
    target = tmp_path / "duplex-server"
    run_script(
        "--wheelhouse", str(wheels), str(target), env=os.environ | {"PYTHON": sys.executable}
    )

    # One pip install of the wheel left nothing for pip to complain of.
    check = subprocess.run(
        [str(target / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

    # It is the installed copy that runs, not this checkout; its default
    # recogniser is Whisper from the pinned model wheel, and semantic_vad's
    # end-of-turn model is there too.
    show = (
        "import duplex_server; print(duplex_server.__file__);"
        "from duplex_server.models.cascade.stages import resolve_asr;"
        "print(resolve_asr('auto', None));"
        "from duplex_server.engine.audio import smart_turn, silero;"
        "print(smart_turn.model_path() is not None, silero.model_path().is_file())"
    )
    where = subprocess.run(
        [str(target / "bin" / "python"), "-c", show],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    path, asr, *models = where.stdout.split()
    assert Path(path).is_relative_to(target), where.stderr
    assert asr == "whisper-ct2"
    assert models == ["True", "True"]

    # Settings from all three places, as a deployment sets them: flags (port,
    # store), the environment (log level, the file) and the file (log format).
    config_file = tmp_path / "config.toml"
    config_file.write_text('log_format = "json"\n')
    monkeypatch.setenv("DUPLEX_SERVER_CONFIG", str(config_file))
    monkeypatch.setenv("DUPLEX_SERVER_LOG_LEVEL", "info")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    server = InstalledServer(
        target,
        f"sqlite:{tmp_path / 'sessions.db'}",
        model=None,  # the embedded default: cascade
        log_level=None,  # from the environment
        cwd=tmp_path,
    )
    server.start(timeout_s=60)
    try:
        with urllib.request.urlopen(server.http_url + "/health", timeout=5) as answer:
            health = json.loads(answer.read())
        assert health["status"] == "ok"
        assert health["model"] == "cascade"
        assert health["store"] == f"sqlite:{tmp_path / 'sessions.db'}"
        asyncio.run(one_session(server.ws_url))
    finally:
        server.stop()
        log = server.log_text()

    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert lines, "the server logged nothing at info"
    for line in lines:
        assert {"ts", "level", "logger", "message", "session_id", "response_id"} <= set(line)
    assert any(line["message"].startswith("Uvicorn running on") for line in lines), log


async def one_session(url: str) -> None:
    """One spoken turn: the embedded recogniser and voice work from the wheels."""
    client = await WsClient.connect(url)
    created = await client.expect("session.created")
    assert created["session"]["id"]
    await client.send({"type": "session.update", "session": {"turn_detection": None}})
    await client.expect("session.updated")
    await client.append(silence(300) + speak("good morning") + silence(300))
    await client.send({"type": "input_audio_buffer.commit"})
    events = await client.recv_until("response.done", timeout=30)
    assert events[-1]["response"]["status"] == "completed"
    transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
    assert transcript["transcript"].startswith("You said")
    assert any(e["type"] == "response.output_audio.delta" for e in events)
    await client.send({"type": "session.close"})
    await client.recv_until("session.closed")
    await client.close()
