"""Which jobs a principal has on a listed route (videos), in order, without
reading their logs: what ``GET /v1/videos?after=&limit=`` pages through.

The log stays the source of truth: the index is built from it when the
runner starts (and, on a shared store, brought up to date with what other
replicas made every lease period), then kept by the runner as it opens and
deletes jobs. It holds ids and creation times only: a page's jobs are read
from the log, ``limit`` of them, whatever the principal's total."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

Key = tuple[int, str]  # (created_ms, job_id): the listing's order


@dataclass(frozen=True)
class Page:
    job_ids: list[str]
    has_more: bool


@dataclass
class JobIndex:
    routes: set[str] = field(default_factory=set)  # the routes whose jobs are listed
    _lists: dict[tuple[str, str], list[Key]] = field(default_factory=dict)
    _where: dict[str, tuple[str, str, Key]] = field(default_factory=dict)

    def add(self, job_id: str, principal: str, route: str, created_ms: int) -> None:
        """Index a job if its route is listed (again: a no-op)."""
        if route not in self.routes or job_id in self._where:
            return
        key = (created_ms, job_id)
        bisect.insort(self._lists.setdefault((principal, route), []), key)
        self._where[job_id] = (principal, route, key)

    def remove(self, job_id: str) -> None:
        found = self._where.pop(job_id, None)
        if found is None:
            return
        principal, route, key = found
        keys = self._lists[(principal, route)]
        del keys[bisect.bisect_left(keys, key)]
        if not keys:
            del self._lists[(principal, route)]

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def page(
        self, principal: str, route: str, after: str | None, limit: int, descending: bool
    ) -> Page:
        """Up to ``limit`` of the principal's jobs on ``route``, oldest first
        (``descending``: newest first), those after the job ``after`` (a
        job not in this listing: an empty page)."""
        keys = self._lists.get((principal, route), [])
        if after is None:
            start, end = 0, len(keys)
        else:
            found = self._where.get(after)
            if found is None or found[:2] != (principal, route):
                return Page([], False)
            position = bisect.bisect_left(keys, found[2])
            start, end = (0, position) if descending else (position + 1, len(keys))
        if descending:
            chosen = keys[max(start, end - limit) : end][::-1]
            return Page([job_id for _, job_id in chosen], end - limit > start)
        chosen = keys[start : start + limit]
        return Page([job_id for _, job_id in chosen], start + limit < end)
