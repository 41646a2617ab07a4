"""Which names a session's model answers to (PROTOCOL.md: the session's model
is what the server serves).

A server serves one model under the names ``--served-model-name`` lists (as
vLLM's flag does; by default the adapter's own name). OpenAI's realtime model
names are aliases of it as well, unless the server is told otherwise: a stock
client (the Agents SDK sends ``gpt-realtime-2.1`` in every ``session.update``)
then opens and configures a session without knowing what runs behind it.
Pure: names in, answers out.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from protocol.errors import ProtocolError
from protocol.session_config import SessionUpdate

# OpenAI's realtime model families; a dated or versioned name
# (gpt-realtime-2025-08-28, gpt-4o-realtime-preview-2024-12-17) is one of them.
OPENAI_REALTIME_FAMILIES = (
    "gpt-realtime",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-realtime-preview",
)
# What /v1/models lists as aliases: one name of each family, and its mini.
OPENAI_REALTIME_LISTED = (
    "gpt-realtime",
    "gpt-realtime-mini",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-realtime-preview",
)


@dataclass(frozen=True)
class ModelNames:
    """``served``: the names the model is served under, the first its default;
    ``openai_aliases``: whether OpenAI's realtime names are aliases of it."""

    served: tuple[str, ...]
    openai_aliases: bool = True

    @classmethod
    def of(cls, model_name: str, served: tuple[str, ...] | list[str] = ()) -> ModelNames:
        return cls(tuple(served) or (model_name,))

    @property
    def default(self) -> str:
        return self.served[0]

    def answers_to(self, name: str) -> bool:
        return name in self.served or (self.openai_aliases and _is_openai_realtime(name))

    def listed(self) -> list[str]:
        """Every name ``/v1/models`` lists, served names first."""
        return [*self.served, *self.aliases]

    @property
    def aliases(self) -> tuple[str, ...]:
        """The names listed for the model besides its served ones (OpenAI's
        realtime names; a dated one of their families answers too)."""
        listed = OPENAI_REALTIME_LISTED if self.openai_aliases else ()
        return tuple(name for name in listed if name not in self.served)


def _is_openai_realtime(name: str) -> bool:
    return any(
        name == family or name.startswith(family + "-") for family in OPENAI_REALTIME_FAMILIES
    )


def opening_model(patch: SessionUpdate, names: ModelNames, strict: bool = True) -> SessionUpdate:
    """The opening patch with the session's model named: the name the client
    asked for (``session.created`` reports it, as OpenAI does), the default
    name when it asked for none. ``strict`` (the OpenAI endpoint): a name the
    model does not answer to is refused, as OpenAI refuses a model it does
    not serve; the duplex wire keeps announcing any name its clients give
    (vLLM-Omni's send their checkpoint's)."""
    if not isinstance(patch.model, str):
        return msgspec.structs.replace(patch, model=names.default)
    if strict and not names.answers_to(patch.model):
        raise ProtocolError(
            "model_not_found",
            f"model {patch.model!r} is not served here; this server serves "
            + ", ".join(repr(name) for name in names.served),
            param="session.model",
        )
    return patch
