"""One declaration per ``serve`` setting, and everything derived from it.

A setting is a field of :class:`~duplex_server.config.ServerConfig` whose
default is :func:`declare` (name and type: the field's; default, group,
help, choices and bounds: the declaration's). From that one place come the
``serve`` flags and their ``--help`` groups, the environment variable
``DUPLEX_SERVER_<NAME>``, the ``--config`` TOML key (the name itself), the
runtime config object (the dataclass) and ``docs/reference/options.md``
(:func:`markdown`; ``duplex-server options [--write]`` prints or writes it). Before,
a setting was named in four files and its bounds lived in the CLI's
argument types only.

Bounds and choices are checked once, by :meth:`Option.parse`: a flag's
text, an environment variable's and a TOML value (as text) all pass through
it, so the same value is refused the same way wherever it came from, and
the caller names the option (argparse: ``argument --port``; the
environment and the file: the variable or the key).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

ENV_PREFIX = "DUPLEX_SERVER_"
_SETTING = "duplex_server.setting"  # the dataclass field's metadata key
DOCS_PATH = Path("docs/reference/options.md")


@dataclasses.dataclass(frozen=True)
class Group:
    """A heading of ``serve --help`` and of the options reference."""

    title: str
    about: str


NETWORK = Group("network", "Where the server listens, and which requests it takes")
STORE = Group("store", "The session log: where it lives and how long it keeps what")
MODELS = Group("models", "The model adapter and its parts (speech in, speech out, weights)")
LLM = Group("LLM", "A local chat model answering in the cascade (--llm)")
LIMITS = Group("limits", "What one session may use, and how many sessions there are")
ACCESS = Group("access", "API keys and per-client caps")
BATCH = Group("batch", "The batch API (/v1/audio, /v1/images, /v1/videos jobs)")
TRANSPORTS = Group("transports", "HTTP and WebSocket connection handling")
TELEPHONY = Group("telephony", "Phone calls streamed in by a carrier (Twilio Media Streams)")
WEBRTC = Group("WebRTC", "Calls over WebRTC (POST /v1/realtime/calls): ICE, ports, bounds")
TLS = Group("TLS", "HTTPS and WSS: both files set, the server speaks TLS only")
LOGGING = Group("logging", "What the server writes about itself")
GROUPS = (
    NETWORK,
    STORE,
    MODELS,
    LLM,
    LIMITS,
    ACCESS,
    BATCH,
    TRANSPORTS,
    TELEPHONY,
    WEBRTC,
    TLS,
    LOGGING,
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a field declares beyond its name, type and default."""

    group: Group
    help: str
    choices: Collection[str] | None = None  # a container: --model's also takes moshi:PATH
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    unit: str | None = None  # what the value is, in a refusal: "give milliseconds in [0, 1000.0]"
    min_length: int | None = None  # text settings (an API key)
    metavar: str | None = None
    repeatable: bool = False  # a list flag given twice adds, rather than replaces
    shown_default: str | None = None  # for a default that differs by machine


def declare(
    default: object = None,
    *,
    group: Group,
    help: str,  # noqa: A002 - argparse's word
    factory: Callable[[], object] | None = None,
    **details: Any,
) -> Any:
    """A ``ServerConfig`` field that is a ``serve`` setting.

    Typed ``Any`` so that the field's annotation, not this call, is its
    type to a checker (as ``dataclasses.field`` is).
    """
    setting = Setting(group=group, help=help, **details)
    metadata = {_SETTING: setting}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Option:
    """A declared setting, resolved against its field."""

    name: str  # the field, the TOML key and the flag's dest
    kind: type  # str, int, float, bool (a switch) or list (of strings)
    optional: bool  # ``None`` is a value (unset)
    default: object
    setting: Setting

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def group(self) -> Group:
        return self.setting.group

    def parse(self, text: str) -> object:
        """``text`` as this setting's value, or ``ArgumentTypeError`` saying
        what is wrong (never echoing a refused text: it may be a key)."""
        if self.kind is list:
            return [name.strip() for name in text.split(",") if name.strip()]
        value: object
        if self.kind is int or self.kind is float:
            try:
                value = self.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"invalid {self.kind.__name__} value {text!r}"
                ) from None
        else:
            value = text
        self._check(value, text)
        return value

    def _check(self, value: object, text: str) -> None:
        setting = self.setting
        if setting.choices is not None and value not in setting.choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(setting.choices)}")
        if setting.min_length is not None and len(str(value).strip()) < setting.min_length:
            raise argparse.ArgumentTypeError(
                f"{setting.unit or 'the value'} needs at least {setting.min_length} characters "
                "(an empty or short one protects nothing)"
            )
        if isinstance(value, int | float) and not self._within(value):
            if setting.maximum is None:
                raise argparse.ArgumentTypeError(f"must be at least {setting.minimum}, not {text}")
            raise argparse.ArgumentTypeError(
                f"{text}: give {setting.unit or 'a number'} in {self.bounds()}"
            )

    def _within(self, value: float) -> bool:
        low, high = self.setting.minimum, self.setting.maximum
        if low is not None and (value <= low if self.setting.exclusive_minimum else value < low):
            return False
        return high is None or value <= high

    def bounds(self) -> str:
        """``[0, 1000.0]``, ``(0, 1]``, ``>= 1``; empty when unbounded."""
        low, high = self.setting.minimum, self.setting.maximum
        if high is None:
            return "" if low is None else f"{'>' if self.setting.exclusive_minimum else '>='} {low}"
        opening = "(" if self.setting.exclusive_minimum else "["
        return f"{opening}{'-inf' if low is None else low}, {high}]"

    def shown_default(self) -> str:
        if self.setting.shown_default is not None:
            return self.setting.shown_default
        if self.kind is bool:
            return "off"
        if self.default is None:
            return "none"
        if isinstance(self.default, list):
            return ",".join(self.default) if self.default else "none"
        return str(self.default)


def env_name(name: str) -> str:
    """``max_sessions`` (a setting's name) -> ``DUPLEX_SERVER_MAX_SESSIONS``."""
    return ENV_PREFIX + name.upper().replace("-", "_")


def options(config_type: type) -> tuple[Option, ...]:
    """The declared settings of a config dataclass, in declaration order."""
    hints = typing.get_type_hints(config_type)
    declared = []
    for field in dataclasses.fields(config_type):
        setting = field.metadata.get(_SETTING)
        if setting is None:
            continue  # a field without a declaration is no option (reap_interval_s)
        kind, optional = _kind(hints[field.name])
        default = (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        declared.append(Option(field.name, kind, optional, default, setting))
    return tuple(declared)


def _kind(hint: object) -> tuple[type, bool]:
    """``int | None`` -> (int, True); ``list[str]`` -> (list, False)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = (arg for arg in args if arg is not type(None))
        return _kind(inner)[0], True
    origin = typing.get_origin(hint)
    if origin is list:
        return list, False
    if hint in (str, int, float, bool):
        return typing.cast(type, hint), False
    raise TypeError(f"a setting must be str, int, float, bool or list[str], not {hint}")


def add_arguments(parser: argparse.ArgumentParser, declared: Iterable[Option]) -> None:
    """Each option as a flag of ``parser``, under its group's heading."""
    by_group = {group: parser.add_argument_group(group.title, group.about) for group in GROUPS}
    for option in declared:
        target = by_group[option.group]
        if option.kind is bool:
            target.add_argument(option.flag, action="store_true", help=option.setting.help)
            continue
        target.add_argument(
            option.flag,
            type=option.parse,
            default=option.default,
            choices=option.setting.choices,
            metavar=option.setting.metavar,
            action="extend" if option.setting.repeatable else "store",
            help=option.setting.help,
        )


def markdown(declared: Iterable[Option]) -> str:
    """The options reference: one table per group."""
    declared = tuple(declared)
    lines = [
        "# `duplex-server serve` options",
        "",
        "<!-- Generated by `duplex-server options --write` from duplex_server/config.py;",
        "     do not edit (a test compares this file with what the code generates). -->",
        "",
        "Every option is also read from its environment variable and from the TOML file named",
        "by `--config` (or `DUPLEX_SERVER_CONFIG`), keys spelled like the option's name",
        "(`max_sessions = 100`). A flag wins over the environment, the environment over the",
        "file, the file over the default. A switch's variable takes 1/0, true/false, yes/no,",
        "on/off; a list's takes comma-separated names.",
        "",
    ]
    for group in GROUPS:
        members = [option for option in declared if option.group is group]
        if not members:
            continue
        lines += [f"## {group.title}", "", group.about + ".", ""]
        lines += ["| Option | Environment | Default | Values | Description |"]
        lines += ["|---|---|---|---|---|"]
        for option in members:
            cells = (
                f"`{option.flag}`",
                f"`{option.env}`",
                f"`{option.shown_default()}`",
                _values(option),
                option.setting.help,
            )
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _values(option: Option) -> str:
    if option.setting.choices is not None:
        return ", ".join(f"`{choice}`" for choice in option.setting.choices)
    if option.kind is bool:
        return "switch"
    words = {str: "text", int: "integer", float: "number", list: "names"}
    kind = words[option.kind]
    if option.setting.repeatable:
        kind += ", repeatable"
    bounds = option.bounds()
    return f"{kind} {bounds}" if bounds else kind
