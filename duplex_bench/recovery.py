"""``duplex-server bench recovery``: how long a restart takes to bring sessions back.

Builds a SQLite store of N sessions x R records through the real command
handlers (audio, commits, streamed responses; some left in flight, as a crash
leaves them), then times ``SessionManager.recover()`` on a fresh process
state against a plain read of the same records (the baseline, same run).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from duplex_server.surface import (
    ActorSettings,
    Batch,
    LeaseBody,
    ManagerSettings,
    ModelChunk,
    ModelFacts,
    Record,
    Response,
    SessionManager,
    SqliteLog,
    audio_append,
    audio_commit,
    build_model,
    emit_chunk,
    finish_response,
    hash_token,
    initial_state,
    new_session_id,
)
from protocol import client_events as ce

TARGET_SECONDS = 3.0
RATE_HZ = 8_000  # small chunks keep the synthetic store modest on disk


def synth_session(session_id: str, count: int, now_ms: int) -> list[Record]:
    """About ``count`` records of a live conversation, ending mid-response."""
    model = build_model("echo")
    state = initial_state(session_id, model.name, model.turn_detection_types)
    records: list[Record] = []

    def run(step) -> None:
        batch = Batch(state, model.capabilities, now_ms)
        step(batch)
        records.extend(batch.records)

    pcm = (np.sin(np.arange(RATE_HZ // 10) / RATE_HZ * 2 * np.pi * 300) * 5000).astype("<i2")
    audio = base64.b64encode(pcm.tobytes()).decode()
    append = ce.InputAudioAppend(audio=audio, sample_rate_hz=RATE_HZ)
    run(
        lambda b: b.fact(
            LeaseBody(
                action="attach", owner="bench", fence=1, generation=1, token_hash=hash_token("t")
            ),
            origin="manager",
        )
    )
    chunk = ModelChunk(audio=pcm.tobytes(), sample_rate_hz=RATE_HZ, text="w ")
    while len(records) < count:
        for _ in range(3):
            run(lambda b: audio_append(b, append, ModelFacts(model)))
        run(lambda b: audio_commit(b, ce.InputAudioCommit(), ModelFacts(model)))
        for _ in range(3):
            if len(records) >= count:
                break
            run(lambda b: emit_chunk(b, _active(b), chunk))
        if len(records) < count:
            run(lambda b: finish_response(b, "completed"))
    return records


async def build_store(path: Path, sessions: int, records: int) -> None:
    log = SqliteLog(path, "os-buffered")
    now_ms = int(time.time() * 1000)
    template = synth_session("sess_template_000000000000", records, now_ms)
    for _ in range(sessions):
        session_id = new_session_id()
        await log.create(session_id)
        fence = await log.acquire_lease(session_id, "bench")
        # The template's records, re-addressed: the fold does not read the id.
        await log.append(session_id, template, fence)
    await log.close()


async def _read_all(path: Path) -> tuple[float, int]:
    log = SqliteLog(path)
    started = time.perf_counter()
    total = 0
    for row in await log.sessions(open_only=True):
        total += len(await log.read(row.session_id))
    elapsed = time.perf_counter() - started
    await log.close()
    return elapsed, total


async def _recover(path: Path, sessions: int) -> tuple[float, int]:
    log = SqliteLog(path)
    manager = SessionManager(
        log,
        build_model("echo"),
        ManagerSettings(
            ActorSettings(owner="bench-recovery"),
            max_sessions=sessions + 10,
            disconnect_grace_s=3600,
        ),
    )
    started = time.perf_counter()
    waiting = await manager.recover()
    elapsed = time.perf_counter() - started
    await manager.shutdown()
    await log.close()
    return elapsed, waiting


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.path) if args.path else Path(tmp) / "recovery.db"
        build_started = time.perf_counter()
        asyncio.run(build_store(path, args.sessions, args.records))
        build_s = time.perf_counter() - build_started
        read_s, total = asyncio.run(_read_all(path))
        recover_s, waiting = asyncio.run(_recover(path, args.sessions))
        print(
            json.dumps(
                {
                    "bench": "recovery",
                    "sessions": args.sessions,
                    "records_per_session": args.records,
                    "records": total,
                    "db_mib": round(path.stat().st_size / 2**20, 1),
                    "build_s": round(build_s, 3),
                    "baseline_read_all_s": round(read_s, 3),
                    "recover_s": round(recover_s, 3),
                    "recover_vs_read_ratio": round(recover_s / read_s, 3) if read_s else None,
                    "sessions_waiting_for_resume": waiting,
                    "targets": {"recover_under_3s": recover_s < TARGET_SECONDS},
                }
            )
        )


def _active(batch: Batch) -> Response:
    """The response the commit above started (echo answers every turn)."""
    response = batch.state.response
    assert response is not None
    return response
