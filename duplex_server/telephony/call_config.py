"""The session config a phone call gets, by the number it called.

A caller sends no ``session.update``: what the session is (model,
instructions, voice, tools, turn detection) is the operator's, written once
in ``--telephony-config`` (TOML)::

    [default]
    instructions = "You answer the phone for Example Ltd."

    [numbers."+15551234567"]
    voice = "alloy"

Each table's keys are ``session.update``'s ``session`` fields; a number's
table is laid over ``[default]`` field by field. The file is checked whole
at start-up: a bad table stops the server rather than the first call to it.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from msgspec import UNSET

from protocol.session_config import SessionUpdate

MAX_FILE_BYTES = 1024 * 1024
MAX_NUMBERS = 10_000
_TABLES = ("default", "numbers")
_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(SessionUpdate))


@dataclass(frozen=True)
class CallConfigs:
    default: SessionUpdate = field(default_factory=SessionUpdate)
    # each number's table, already laid over the default
    numbers: Mapping[str, SessionUpdate] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | None) -> CallConfigs:
        """The file's configs (none given: every call gets ``SessionUpdate()``).
        Raises ValueError naming the file and the table at fault."""
        if path is None:
            return cls()
        document = _read(Path(path))
        unknown = sorted(set(document) - set(_TABLES))
        if unknown:
            raise ValueError(f"{path}: unknown table(s) {unknown}; expected [default], [numbers]")
        default = _session(path, "[default]", document.get("default", {}))
        numbers = _numbers(path, document.get("numbers", {}))
        merged = {
            number: _laid_over(default, _session(path, f'[numbers."{number}"]', table))
            for number, table in numbers.items()
        }
        return cls(default, merged)

    def for_number(self, called: str) -> SessionUpdate:
        """The config of a call to ``called``; a number not listed gets the default."""
        return self.numbers.get(called, self.default)


def _read(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not TOML: {exc}") from exc


def _numbers(path: str, numbers: object) -> dict[str, object]:
    if not isinstance(numbers, dict):
        raise ValueError(f'{path}: [numbers] must hold tables, as [numbers."+15551234567"]')
    if len(numbers) > MAX_NUMBERS:
        raise ValueError(f"{path}: [numbers] lists {len(numbers)} numbers, more than {MAX_NUMBERS}")
    return numbers


def _session(path: str, name: str, table: object) -> SessionUpdate:
    """One table as a session config. A key that is no session field is
    refused: a misspelt ``instruction`` would otherwise be dropped unseen."""
    if not isinstance(table, dict):
        raise ValueError(f"{path}: {name} must be a table of session fields")
    unknown = sorted(set(table) - _FIELDS)
    if unknown:
        raise ValueError(f"{path}: {name}: unknown session field(s) {unknown}")
    try:
        return msgspec.convert(table, SessionUpdate)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {name}: {exc}") from None


def _laid_over(default: SessionUpdate, number: SessionUpdate) -> SessionUpdate:
    """``default`` with every field ``number`` sets replaced (whole: a number's
    ``audio`` replaces the default's ``audio``)."""
    changes = {
        f.name: getattr(number, f.name)
        for f in msgspec.structs.fields(SessionUpdate)
        if getattr(number, f.name) is not UNSET
    }
    return msgspec.structs.replace(default, **changes)
