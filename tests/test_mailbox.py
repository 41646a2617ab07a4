"""The mailbox is one union: every message kind is a member, so the actor's
``match`` (checked by mypy's ``assert_never``) handles each or fails to type-check."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from duplex_server.sessions.runtime import mailbox as mb


def _kinds() -> set[type]:
    """Every message dataclass the mailbox defines or takes from the core
    (the model's output is a core input: core/model_output.py)."""
    return {
        cls for _, cls in inspect.getmembers(mb, inspect.isclass) if dataclasses.is_dataclass(cls)
    }


def test_every_message_kind_is_in_the_union():
    assert set(typing.get_args(mb.Message)) == _kinds()


def test_the_tuple_isinstance_sees_is_the_union_mypy_sees():
    assert typing.get_args(mb.NeedsLog) == mb.NEEDS_LOG
    assert typing.get_args(mb.SocketMessage) == mb.SOCKET_MESSAGES
    assert set(typing.get_args(mb.SocketMessage)) <= set(typing.get_args(mb.Message))
