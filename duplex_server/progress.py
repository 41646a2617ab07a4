"""Progress on stderr while the server loads its models, drawn by tqdm: only
where stderr is a terminal (someone watching ``duplex-server serve`` start),
never into a log file, a pipe or a container's log stream, where the log
lines say what loaded.

:func:`loads` counts the loads done before the server listens (the
cascade's recogniser, voice and voice-activity model); :func:`watch` shows
a load that goes on in the background after it listens (an LLM's weights)
until it is up or has failed. ``serve --quiet`` turns both off
(:func:`set_quiet`), for a terminal that should show the log lines alone.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
WATCH_PERIOD_S = 0.5
# serve --quiet: one switch for the process, as stderr is one for the process
_quiet = False


def set_quiet(quiet: bool) -> None:
    """Whether the load bars are off everywhere (``serve --quiet``)."""
    global _quiet
    _quiet = quiet


def _bar(desc: str, total: int | None, unit: str) -> tqdm:
    # disable=None: drawn only when stderr is a terminal
    disable = True if _quiet else None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=disable, leave=False)


class Loads:
    """Each :meth:`load` names the model it loads on the bar, then counts it."""

    def __init__(self, bar: tqdm) -> None:
        self._bar = bar

    def load(self, name: str, build: Callable[..., T], *args: object) -> T:
        self._bar.set_postfix_str(name)
        built = build(*args)
        self._bar.update()
        return built


@contextmanager
def loads(desc: str, total: int) -> Iterator[Loads]:
    with _bar(desc, total, "model") as bar:
        yield Loads(bar)


def watch(desc: str, done: Callable[[], bool]) -> None:
    """A bar of the seconds spent until ``done()``, on a daemon thread (the
    server goes on starting meanwhile); nothing where it would not be drawn."""
    bar = _bar(desc, None, "s")
    if bar.disable:
        return

    def follow() -> None:
        began = time.monotonic()
        with bar:
            while not done():
                time.sleep(WATCH_PERIOD_S)
                bar.update(time.monotonic() - began - bar.n)

    threading.Thread(target=follow, name="load-progress", daemon=True).start()
