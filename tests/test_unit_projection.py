"""Model output onto the wire and into the log (core.responses.project_unit_outputs):
a native model's floor decisions, and a tool call as a function_call item of
the response that made it; refold == live throughout."""

from __future__ import annotations

import msgspec

from duplex_server.models import build_model
from duplex_server.sessions.core.batch import Batch
from duplex_server.sessions.core.model_port import FunctionCallPart, UnitOutput
from duplex_server.sessions.core.records import Record
from duplex_server.sessions.core.responses import project_unit_outputs
from duplex_server.sessions.core.state import SessionState, fold, initial_state

MODEL = build_model("scripted")
WEATHER = FunctionCallPart(call_id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def project(state: SessionState, log: list[Record], outputs: list[UnitOutput]) -> list[dict]:
    batch = Batch(state, MODEL.capabilities, 1000 + len(log), None)
    project_unit_outputs(batch, outputs, lambda response_id: None)
    batch.settle()  # as the actor does before it appends
    log.extend(batch.records)
    return [msgspec.json.decode(payload) for _, payload in batch.outbound]


def test_a_tool_call_is_a_function_call_item_of_its_response():
    state, log = initial_state("sess_proj0001", MODEL.name, ()), []
    events = project(
        state,
        log,
        [
            UnitOutput(decision="speak", text="let me look that up"),
            UnitOutput(function_call=WEATHER),
            UnitOutput(decision="end_of_turn"),
        ],
    )
    types = [e["type"] for e in events]
    at = types.index("response.function_call_arguments.done")
    assert types[at - 4 : at + 3] == [
        "response.output_item.added",
        "conversation.item.added",
        "conversation.item.created",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    done = events[at]
    assert (done["call_id"], done["name"], done["arguments"], done["output_index"]) == (
        "call_1",
        "get_weather",
        '{"city": "Paris"}',
        1,
    )
    response = next(e for e in events if e["type"] == "response.done")["response"]
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    call = state.items[-1]
    assert (call.type, call.call_id, call.name) == ("function_call", "call_1", "get_weather")
    assert fold(log, initial_state("sess_proj0001", MODEL.name, ())) == state


def test_a_tool_call_alone_opens_a_response():
    state, log = initial_state("sess_proj0002", MODEL.name, ()), []
    events = project(state, log, [UnitOutput(function_call=WEATHER)])
    # the floor changed hands: told once, after the batch's other events
    assert (events[-1]["type"], events[-1]["event"]) == ("turn.event", "assistant_generating")
    assert state.response is not None and state.response.call_item_ids == [state.items[-1].id]
    second = FunctionCallPart(call_id="call_2", name="get_time", arguments="{}")
    events = project(state, log, [UnitOutput(function_call=second), UnitOutput(decision="yield")])
    indexes = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert indexes == [2]
    response = next(e for e in events if e["type"] == "response.done")["response"]
    assert [item.get("call_id") for item in response["output"][1:]] == ["call_1", "call_2"]
    assert fold(log, initial_state("sess_proj0002", MODEL.name, ())) == state
