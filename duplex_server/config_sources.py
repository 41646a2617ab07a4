"""Where a ``serve`` setting comes from, besides its flag.

A setting is taken from, first to last: its command-line flag, the
environment variable ``DUPLEX_SERVER_<OPTION>`` (``--max-sessions`` is
``DUPLEX_SERVER_MAX_SESSIONS``), the TOML file named by ``--config`` (or
``DUPLEX_SERVER_CONFIG``) with keys spelled like the options
(``max_sessions = 100``), and its default. The options and their types
are read off the ``serve`` parser, whose flags are the declared settings
(duplex_server.settings), so a new setting is settable in all three places
without being listed again; a value from the environment or the file goes
through the flag's own type, which checks its choices and bounds
(``Option.parse``), as a flag's value does.

The environment and the file become the parser's defaults, so that a flag
given on the command line still wins. A value that does not fit its option
is refused with its source and key named; so is an unknown key in the file.
Unknown ``DUPLEX_SERVER_*`` variables are left alone: the environment is
shared (Kubernetes, for one, sets ``DUPLEX_SERVER_SERVICE_HOST`` for a
Service of that name).
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from duplex_server.settings import ENV_PREFIX, env_name

__all__ = ["CONFIG_OPTION", "ENV_PREFIX", "ConfigSourceError", "env_name", "layered_defaults"]

CONFIG_OPTION = "config"  # the file's own option: set by flag or environment, never in a file
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigSourceError(ValueError):
    """A setting from the environment or the config file does not fit its option."""


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's settable options by dest (``max_sessions``); not
    ``--help`` or ``--version``, which print and exit rather than set."""
    return {
        action.dest: action
        for action in parser._actions
        if action.option_strings
        and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
    }


def layered_defaults(
    parser: argparse.ArgumentParser, config_path: str | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The parser's defaults with the config file over them and the
    environment over that; ``config_path`` is ``--config`` as given on the
    command line (``None``: ``DUPLEX_SERVER_CONFIG``, if set)."""
    known = options(parser)
    values: dict[str, Any] = {}
    path = config_path or environ.get(env_name(CONFIG_OPTION)) or None
    if path is not None:
        values |= _from_file(known, Path(path))
    values |= _from_environment(known, environ)
    return values


def _from_environment(
    known: Mapping[str, argparse.Action], environ: Mapping[str, str]
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for dest, action in known.items():
        raw = environ.get(env_name(dest))
        if raw is None:
            continue
        source = f"environment variable {env_name(dest)}"
        if _is_switch(action):
            values[dest] = _switch(raw, source)
        else:
            values[dest] = _convert(action, raw, source)
    return values


def _from_file(known: Mapping[str, argparse.Action], path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            table = tomllib.load(file)
    except OSError as exc:
        raise ConfigSourceError(f"config file {path}: cannot read it: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigSourceError(f"config file {path}: not TOML: {exc}") from exc
    values: dict[str, Any] = {}
    for key, value in table.items():
        source = f"config file {path}, key {key!r}"
        action = known.get(key)
        if key == CONFIG_OPTION:
            raise ConfigSourceError(f"config file {path}: a config file cannot name another")
        if action is None:
            raise ConfigSourceError(f"config file {path}: unknown key {key!r}{_hint(key, known)}")
        values[key] = _from_toml(action, value, source)
    return values


def _from_toml(action: argparse.Action, value: object, source: str) -> Any:
    """A TOML value, typed as the flag's value would be: a switch takes a
    boolean, a number option a number, a list option a list of strings or
    one comma-separated string, any other option a string."""
    if _is_switch(action):
        if not isinstance(value, bool):
            raise ConfigSourceError(f"{source}: expected true or false, got {_shown(value)}")
        return value
    if isinstance(value, bool | dict) or (
        isinstance(value, list) and not all(isinstance(item, str) for item in value)
    ):
        raise ConfigSourceError(f"{source}: {_shown(value)} is not a value this option takes")
    if isinstance(value, list):
        text = ",".join(value)
    elif isinstance(value, str | int | float):
        text = str(value)
    else:  # dates and times
        raise ConfigSourceError(f"{source}: {_shown(value)} is not a value this option takes")
    converted = _convert(action, text, source)
    if not _same_kind(value, converted):
        raise ConfigSourceError(
            f"{source}: expected {_kind(converted)}, got {_shown(value)} ({_kind(value)})"
        )
    return converted


def _convert(action: argparse.Action, text: str, source: str) -> Any:
    """``text`` through the flag's own type (its choices and bounds too), as
    the command line would."""
    convert = action.type if callable(action.type) else str
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as exc:  # says what is wrong; no echo (it may be a key)
        raise ConfigSourceError(f"{source}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        name = getattr(convert, "__name__", "")
        raise ConfigSourceError(f"{source}: invalid {name} value {text!r}") from exc
    return value


def _is_switch(action: argparse.Action) -> bool:
    """``store_true`` and ``store_false``: a flag that takes no value."""
    return action.nargs == 0 and isinstance(action.const, bool)


def _switch(raw: str, source: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigSourceError(
        f"{source}: {raw!r} is neither true (1, yes, on) nor false (0, no, off)"
    )


def _same_kind(toml_value: object, converted: object) -> bool:
    """Whether a TOML value's type is what the option makes of it (an
    integer is a fine float; ``port = "8000"`` is not a port)."""
    if isinstance(converted, bool):
        return False  # switches are handled apart; no other option is boolean
    if isinstance(converted, int):
        return isinstance(toml_value, int)
    if isinstance(converted, float):
        return isinstance(toml_value, int | float)
    if isinstance(converted, list):
        return isinstance(toml_value, list | str)
    return isinstance(toml_value, str)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, list):
        return "a list of strings"
    if isinstance(value, dict):
        return "a table"
    return "a string"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def _hint(key: str, known: Mapping[str, argparse.Action]) -> str:
    spelled = key.replace("-", "_")
    if spelled in known and spelled != CONFIG_OPTION:
        return f" (keys are spelled with underscores: {spelled!r})"
    close = difflib.get_close_matches(key, [k for k in known if k != CONFIG_OPTION], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
