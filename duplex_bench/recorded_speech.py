"""Recorded human speech with its reference text, for ``bench voice``.

eSpeak's voice is not a person's: a recogniser can hear one and not the
other. The recordings here are people reading aloud, taken from the test
data in PocketSphinx's source distribution on PyPI (``pocketsphinx==5.1.1``,
pinned by its sha256 and every file's; BSD-2-Clause, Carnegie Mellon
University), fetched with pip at install time, never vendored:

- five card names read by one speaker (``test/data/cards``, "ten of clubs"…),
  and "go forward ten meters" (``test/data/goforward.raw``), CMU's own test
  recordings, under the package's licence;
- five sentences of Jane Austen's *Sense and Sensibility* read for LibriVox
  (``test/data/librivox``): the text and LibriVox's recordings are in the
  public domain. Two consecutive ones (0870 and 0880) make the ~10 s reading.

All are 16 kHz mono pcm16. The references are the package's own
transcriptions. The audio is noisy (a 64 kb/s MP3 source for LibriVox) and
the card names are clipped tight at both ends: real microphones, not a studio.

``python -m duplex_bench.recorded_speech [DIR]`` fetches into DIR
(default :func:`default_dir`); ``scripts/fetch-speech`` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGE = "pocketsphinx"
VERSION = "5.1.1"
SDIST_SHA256 = "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355"
LICENCE = "BSD-2-Clause (CMU) for the package; LibriVox recordings and Austen's text public domain"
SAMPLE_RATE_HZ = 16_000
# Below the clip's loudest 20 ms by this much, a frame is not speech: the
# recordings' noise floors sit 25-40 dB under their peaks.
SPEECH_BELOW_PEAK_DB = 30.0
FRAME_MS = 20

_LIBRIVOX = "test/data/librivox/sense_and_sensibility_01_austen_64kb-0"
# Each file inside the sdist, under its top folder, with its sha256.
FILES = {
    "test/data/cards/001.wav": "899951e768666f27c8f8b1d4090b96fe7909cae9cec01bec0a5d5d1b8a8d566e",
    "test/data/cards/002.wav": "a3f9eae6fdb69a1231989e39a14d62388a6f52fb59666c76d95005318fadafec",
    "test/data/cards/003.wav": "00d283e46bc257ae479e4aa86593cadb541656eba1d19fc8abeece37f6a5a18b",
    "test/data/cards/004.wav": "4c44a8177f5b128b99f078cdeb918119933155574231f1833e8840d1af09c521",
    "test/data/cards/005.wav": "090f18f5f76cf8b2b43cd9e6b07823f4685a4742d9a36cd98b174a6586c18cf9",
    "test/data/goforward.raw": "f15c60ec54059d8b66e410d0064945a0b0a04ea56e1ddca1958e493c0cf70e71",
    f"{_LIBRIVOX}870.wav": "b0557cf95c974d930577e58e46b7f068c432a6e3afcc286563d88922b2a5315c",
    f"{_LIBRIVOX}880.wav": "fbec491ef00ee734a67f0ee318e98c51c157b479e1629ff4f4426861ecac0414",
    f"{_LIBRIVOX}890.wav": "5793ffbdee55fb8bfd284943a6866864c832d9d4accf2661cabd39915c84ee10",
    f"{_LIBRIVOX}920.wav": "40882414ef4cc51f3ff7a63bad0c8c87e7f595ffeb8209fbf756c8ebc5c28a59",
    f"{_LIBRIVOX}930.wav": "954adbf0b56ac8a148cbe77b39ca18d76b5f2a1e1f405565bd786ce3e68a68b7",
    "LICENSE": "",  # kept beside the audio; its text is not pinned
}


@dataclass(frozen=True)
class Script:
    """What one utterance is: its name, the words said, the files joined in order."""

    name: str
    reference: str
    files: tuple[str, ...]


READING = "reading"  # the ~10 s one; the single-session real-time factors are timed on it
# The reading first: with 4 sessions, every session's first turn is taken
# in turn, so a run of one turn still has it.
SCRIPTS = (
    Script(
        READING,
        "and mister john dashwood had then leisure to consider how much there might be "
        "prudently in his power to do for them he was not an ill disposed young man",
        (f"{_LIBRIVOX}870.wav", f"{_LIBRIVOX}880.wav"),
    ),
    Script("ten_of_clubs", "ten of clubs", ("test/data/cards/001.wav",)),
    Script("go_forward", "go forward ten meters", ("test/data/goforward.raw",)),
    Script(
        "cold_hearted",
        "unless to be rather cold hearted and rather selfish is to be ill disposed",
        (f"{_LIBRIVOX}890.wav",),
    ),
    Script("four_queen", "four queen of clubs", ("test/data/cards/002.wav",)),
    Script(
        "amiable_woman",
        "had he married a more a amiable woman he might have been made still more "
        "respectable than he was",
        (f"{_LIBRIVOX}920.wav",),
    ),
    Script("seven_of_clubs", "seven of clubs", ("test/data/cards/003.wav",)),
    Script(
        "amiable_himself", "he might even have been made amiable himself", (f"{_LIBRIVOX}930.wav",)
    ),
    Script("five_five", "five five", ("test/data/cards/004.wav",)),
    Script(
        "three_cards",
        "eight of spades four of clubs seven of hearts",
        ("test/data/cards/005.wav",),
    ),
)


@dataclass(frozen=True)
class Utterance:
    name: str
    reference: str
    pcm16: bytes  # mono, SAMPLE_RATE_HZ
    speech_end_s: float  # where the last speech frame ends (the clip's tail may be silence)

    @property
    def seconds(self) -> float:
        return len(self.pcm16) / 2 / SAMPLE_RATE_HZ


class SpeechMissing(RuntimeError):
    """The recordings are not in the directory, or one of them is not the pinned file."""


def default_dir() -> Path:
    """``$DUPLEX_SERVER_SPEECH_DIR``, else the user's cache."""
    configured = os.environ.get("DUPLEX_SERVER_SPEECH_DIR")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "duplex-server" / "speech" / f"{PACKAGE}-{VERSION}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(directory: Path) -> None:
    """Download the pinned sdist with pip (hash-checked) and keep only the
    recordings, each checked against its own hash."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{SDIST_SHA256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
            + ["--no-deps", "--no-binary", ":all:", "--require-hashes"]
            + ["-r", str(requirements), "-d", tmp],
            check=True,
        )
        sdist = (Path(tmp) / f"{PACKAGE}-{VERSION}.tar.gz").read_bytes()
        if _sha256(sdist) != SDIST_SHA256:
            raise SpeechMissing(f"{PACKAGE}-{VERSION}.tar.gz is not the pinned file")
        with tarfile.open(fileobj=io.BytesIO(sdist), mode="r:gz") as tar:
            for name, digest in FILES.items():
                member = tar.extractfile(f"{PACKAGE}-{VERSION}/{name}")
                if member is None:
                    raise SpeechMissing(f"{name} is not a file in {PACKAGE}-{VERSION}")
                data = member.read()
                if digest and _sha256(data) != digest:
                    raise SpeechMissing(f"{name} in {PACKAGE}-{VERSION} is not the pinned file")
                target = directory / name
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(target.suffix + ".part")
                partial.write_bytes(data)
                partial.replace(target)


def ensure(directory: Path) -> Path:
    """The directory, fetched first if any recording is missing."""
    if not all((directory / name).is_file() for name in FILES):
        print(f"fetching recorded speech ({PACKAGE}=={VERSION}) into {directory}", file=sys.stderr)
        fetch(directory)
    return directory


def _read(directory: Path, name: str) -> bytes:
    path = directory / name
    if not path.is_file():
        raise SpeechMissing(f"{path} is missing: run scripts/fetch-speech")
    data = path.read_bytes()
    if _sha256(data) != FILES[name]:
        raise SpeechMissing(f"{path} is not the pinned recording: run scripts/fetch-speech")
    if name.endswith(".raw"):  # headerless: 16 kHz mono pcm16, little-endian
        return data
    with wave.open(io.BytesIO(data)) as clip:
        shape = (clip.getframerate(), clip.getnchannels(), clip.getsampwidth())
        if shape != (SAMPLE_RATE_HZ, 1, 2):
            raise SpeechMissing(f"{path}: expected 16 kHz mono pcm16, got {shape}")
        return clip.readframes(clip.getnframes())


def speech_end_s(pcm16: bytes) -> float:
    """The end of the last 20 ms frame within ``SPEECH_BELOW_PEAK_DB`` of the
    loudest: where the speaker stopped, not where the clip stops."""
    samples = np.frombuffer(pcm16, "<i2").astype(np.float64)
    step = SAMPLE_RATE_HZ * FRAME_MS // 1000
    frames = samples[: len(samples) // step * step].reshape(-1, step)
    if not len(frames):
        return 0.0
    level = 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) + 1.0)
    loud = np.flatnonzero(level > level.max() - SPEECH_BELOW_PEAK_DB)
    return (int(loud[-1]) + 1) * FRAME_MS / 1000


def load(directory: Path) -> list[Utterance]:
    """Every scripted utterance, in :data:`SCRIPTS` order."""
    utterances = []
    for script in SCRIPTS:
        pcm16 = b"".join(_read(directory, name) for name in script.files)
        utterances.append(Utterance(script.name, script.reference, pcm16, speech_end_s(pcm16)))
    return utterances


def load_for(bench: str, speech_dir: str) -> list[Utterance]:
    """A bench's utterances from ``speech_dir`` (empty: :func:`default_dir`),
    fetched there when missing; a bench that cannot have them exits saying why."""
    directory = Path(speech_dir) if speech_dir else default_dir()
    try:
        return load(ensure(directory))
    except SpeechMissing as exc:
        raise SystemExit(f"bench {bench}: {exc}") from None


def source() -> dict:
    """Where the recordings come from, for a report."""
    return {
        "package": f"{PACKAGE}=={VERSION} (sdist, PyPI)",
        "sha256": SDIST_SHA256,
        "licence": LICENCE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=None)
    directory = parser.parse_args().directory or default_dir()
    ensure(directory)
    for utterance in load(directory):
        print(f"{utterance.name}: {utterance.seconds:.2f} s  {utterance.reference!r}")


if __name__ == "__main__":
    main()
