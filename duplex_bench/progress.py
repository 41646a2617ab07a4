"""Progress on stderr for a bench that runs longer than a few seconds, drawn by
tqdm: off where stderr is not a terminal (a pipe, a file, CI) and with
``--quiet``, so that what a script captures is the bench's one JSON line on
stdout and nothing else."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

TICK_S = 0.5


def bar(args: argparse.Namespace, desc: str, total: float | None = None, unit: str = "it") -> tqdm:
    """A bar to ``update`` as the bench goes and ``close`` (or leave as a
    context manager) at the end."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        # None: tqdm draws only when its file is a terminal
        disable=True if getattr(args, "quiet", False) else None,
        dynamic_ncols=True,
    )


@contextmanager
def elapsed(args: argparse.Namespace, desc: str) -> Iterator[None]:
    """For a bench with no bar of its own: the seconds it has run so far,
    ticking on a daemon thread while the body runs (nothing where no bar
    would be drawn)."""
    timer = tqdm(
        desc=desc,
        unit="s",
        file=sys.stderr,
        disable=True if getattr(args, "quiet", False) else None,
        bar_format="{desc}: {elapsed} elapsed",
    )
    if timer.disable:
        yield
        return
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            timer.refresh()

    ticker = threading.Thread(target=tick, name="bench-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        timer.close()
