"""Progress on stderr for a bench that runs longer than a few seconds, drawn by
tqdm: off where stderr is not a terminal (a pipe, a file, CI) and with
``--quiet``, so that what a script captures is the bench's one JSON line on
stdout and nothing else."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm


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
