"""What a Moshi-architecture checkpoint directory must hold, checked from its
``config.json`` before any weight is read, so that ``--model moshi:PATH``
naming something else fails at start-up with a reason, not at a tick."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEVICES_HELP = "'cpu', 'cuda' or 'cuda:N'"
DTYPES = ("auto", "float32", "bfloat16", "float16")
MOSHI_WINDOW = 3000  # MoshiConfig's default sliding window: 4 minutes of frames
# --moshi-step: the batched step through transformers' modules, or the fast one (fast_step)
MOSHI_STEPS = ("eager", "fast")


class MoshiCheckpointError(ValueError):
    """The directory is not a Moshi-architecture checkpoint this server can serve."""


@dataclass(frozen=True)
class MoshiCheckpoint:
    directory: Path
    num_codebooks: int
    sampling_rate: int
    window: int  # frames the temporal transformer attends to (its sliding window)


def check_moshi_checkpoint(path: str) -> MoshiCheckpoint:
    directory = Path(path)
    where = f"--model moshi:{path}"
    config_file = directory / "config.json"
    if not directory.is_dir():
        raise MoshiCheckpointError(f"{where}: no such directory")
    if not config_file.is_file():
        raise MoshiCheckpointError(
            f"{where}: not a checkpoint directory (no config.json); give a Moshi checkpoint "
            "in Hugging Face format (MoshiForConditionalGeneration.save_pretrained)"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MoshiCheckpointError(f"{where}: config.json is not readable JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("model_type") != "moshi":
        found = config.get("model_type") if isinstance(config, dict) else None
        raise MoshiCheckpointError(
            f"{where}: config.json has model_type {found!r}, not 'moshi' "
            "(a Moshi / PersonaPlex checkpoint in Hugging Face format)"
        )
    return _check_parts(where, directory, config)


def _check_parts(where: str, directory: Path, config: dict[str, object]) -> MoshiCheckpoint:
    codec = config.get("audio_encoder_config")
    if not isinstance(codec, dict) or codec.get("model_type") != "mimi":
        raise MoshiCheckpointError(f"{where}: its audio_encoder_config is not a Mimi codec")
    depth = config.get("depth_decoder_config")
    codebooks = config.get("num_codebooks", 8)
    if not isinstance(depth, dict) or not isinstance(codebooks, int):
        raise MoshiCheckpointError(f"{where}: no depth_decoder_config")
    window = depth.get("sliding_window", 8)
    if not isinstance(window, int) or window < codebooks:
        raise MoshiCheckpointError(
            f"{where}: the depth decoder's sliding_window ({window}) is shorter than its "
            f"{codebooks} codebooks: it would forget a frame's first codes"
        )
    rate = codec.get("sampling_rate", 24_000)
    if rate != 24_000:
        raise MoshiCheckpointError(f"{where}: Mimi at {rate} Hz; this server serves 24 kHz")
    # No sliding window: it attends as far as its positions reach.
    temporal = config.get("sliding_window", MOSHI_WINDOW) or config.get(
        "max_position_embeddings", MOSHI_WINDOW
    )
    if not isinstance(temporal, int) or temporal < 1:
        raise MoshiCheckpointError(f"{where}: its sliding_window ({temporal!r}) is not a length")
    return MoshiCheckpoint(directory, codebooks, rate, temporal)
