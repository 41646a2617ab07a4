"""kill -9 of a real ``--llm`` server mid-answer, restart on the same
database, resume: the answer in flight ended ``incomplete`` /
``server_restart``, and the next turn is answered from the honest history
(the answer nobody acknowledged hearing is not in the model's chat)."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from duplex_bench.tiny_llm import CAPITAL, trained_chat_model
from tests.e2e.serverproc import ServerProcess
from tests.wsclient import WsClient

QUESTION = "What is the capital of Spain?"


async def ready(server: ServerProcess) -> None:
    """Until ``/ready`` answers 200 (the weights load after ``/health``)."""
    while True:
        try:
            with urllib.request.urlopen(server.http_url + "/ready", timeout=2):
                return
        except (urllib.error.HTTPError, OSError):
            await asyncio.sleep(0.1)


def ask(text: str) -> dict:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    return {"type": "conversation.item.create", "item": item}


async def test_kill9_mid_answer_then_resume_and_answer_from_honest_history(
    tmp_path_factory, tmp_path
):
    model = trained_chat_model(tmp_path_factory.getbasetemp())
    db = f"sqlite:{tmp_path / 'llm-crash.db'}"
    flags = {"model": "cascade", "llm": str(model)}
    first = ServerProcess(db, **flags).start(timeout_s=120)
    try:
        await asyncio.wait_for(ready(first), 120)
        client = await WsClient.connect(first.ws_url)
        created = await client.expect("session.created")
        session_id, token = created["session"]["id"], created["resume_token"]
        await client.send({"type": "session.update", "session": {"turn_detection": None}})
        await client.send(ask(QUESTION))
        await client.send({"type": "response.create"})  # spoken: paced, so it is long-lived
        # Most of the answer is out when the server dies: were those words in
        # the next chat, the tiny model would not give its trained reply.
        seen, spoken = [], ""
        while len(spoken) < len("The capital of Spain"):
            seen.append(await client.recv(timeout=60))
            if seen[-1]["type"] == "response.output_audio_transcript.delta":
                spoken += seen[-1]["delta"]
        first.kill9()
    finally:
        first.stop()
    cursor = max(e["server_event_seq"] or 0 for e in seen)
    question_id = next(
        e["item"]["id"]
        for e in seen
        if e["type"] == "conversation.item.added" and e["item"].get("role") == "user"
    )

    second = ServerProcess(db, port=first.port, **flags).start(timeout_s=120)
    try:
        await asyncio.wait_for(ready(second), 120)
        again = await WsClient.connect(second.ws_url + "&autostart=0")
        await again.send(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": cursor,
            }
        )
        resumed = await again.expect("session.resumed")
        replay = [await again.recv() for _ in range(resumed["replay_to_seq"] - cursor)]
        (done,) = [e for e in replay if e["type"] == "response.done"]
        assert done["response"]["status"] == "incomplete"
        assert done["response"]["duplex"]["reason"] == "server_restart"
        # The interrupted answer's item stays, heard by nobody: without the
        # question before it, the chat is the question alone, and the model
        # gives its trained reply (were the unheard words in it, it would not).
        await again.send({"type": "conversation.item.delete", "item_id": question_id})
        await again.recv_until("conversation.item.deleted")
        await again.send(ask(QUESTION))
        await again.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = await again.recv_until("response.done", timeout=60)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert (text, events[-1]["response"]["status"]) == (CAPITAL, "completed")
    finally:
        second.stop()
