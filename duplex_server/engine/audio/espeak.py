"""Text to speech with eSpeak NG, from the library and voices shipped in the
``espeakng-loader`` wheel (ctypes; no system package).

eSpeak keeps global state, so there is one engine per process and calls are
serialised by the caller (the TTS stage's worker thread).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import espeakng_loader

AUDIO_OUTPUT_SYNCHRONOUS = 2
ESPEAK_CHARS_UTF8 = 1
ESPEAK_RATE = 1
EE_OK = 0
MIN_WPM, MAX_WPM = 80, 450
DEFAULT_WPM = 175

# int callback(short *wav, int numsamples, espeak_EVENT *events)
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class EspeakError(RuntimeError):
    pass


class Espeak:
    """Synthesises pcm16 mono at :attr:`sample_rate_hz` (22,050 Hz for eSpeak NG)."""

    _lock = threading.Lock()
    _instance: Espeak | None = None

    @classmethod
    def shared(cls) -> Espeak:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data = Path(espeakng_loader.get_data_path())
        self._lib.espeak_Initialize.restype = ctypes.c_int
        self._lib.espeak_Initialize.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        rate = self._lib.espeak_Initialize(
            AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data.parent).encode(), 0
        )
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed with data at {data}")
        self.sample_rate_hz = rate
        self._chunks: list[bytes] = []
        self._callback = _SYNTH_CALLBACK(self._collect)  # held: C keeps a raw pointer
        self._lib.espeak_SetSynthCallback(self._callback)
        self._lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self._lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self.voices = self._voice_names(data)
        self._variants = frozenset(p.name for p in (data / "voices" / "!v").iterdir())
        self._voice: str | None = None

    @staticmethod
    def _voice_names(data: Path) -> frozenset[str]:
        """The language files (``en``, ``en-us``, ``en-gb-x-rp``) whose
        dictionary ships: the names ``espeak_SetVoiceByName`` speaks, lower-cased."""
        dictionaries = {p.name.removesuffix("_dict") for p in data.glob("*_dict")}
        languages = (p.name.lower() for p in (data / "lang").rglob("*") if p.is_file())
        return frozenset(name for name in languages if name.split("-")[0] in dictionaries)

    def knows_voice(self, voice: str) -> bool:
        """Whether ``voice`` (``language[+variant]``) names a voice we ship,
        checked from the data files so that no synthesis is disturbed."""
        language, _, variant = voice.partition("+")
        return language.lower() in self.voices and (not variant or variant in self._variants)

    def _collect(self, wav, count: int, _events) -> int:
        if count > 0 and wav:
            self._chunks.append(ctypes.string_at(wav, count * 2))
        return 0  # continue

    def synthesize(self, text: str, voice: str = "en", speed: float = 1.0) -> bytes:
        """pcm16 of ``text``; ``speed`` scales the default 175 words per minute."""
        if voice != self._voice:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != EE_OK:
                raise EspeakError(f"unknown eSpeak voice {voice!r}")
            self._voice = voice
        wpm = round(min(MAX_WPM, max(MIN_WPM, DEFAULT_WPM * speed)))
        self._lib.espeak_SetParameter(ESPEAK_RATE, wpm, 0)
        encoded = text.encode() + b"\0"
        self._chunks = []
        buffer = ctypes.create_string_buffer(encoded)
        status = self._lib.espeak_Synth(
            buffer, len(encoded), 0, 0, 0, ESPEAK_CHARS_UTF8, None, None
        )
        if status != EE_OK:
            raise EspeakError(f"espeak_Synth failed ({status})")
        self._lib.espeak_Synchronize()
        pcm, self._chunks = b"".join(self._chunks), []
        return pcm
