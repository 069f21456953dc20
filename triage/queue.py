"""The dual heap of seed 004 (Alg. 1, 3, 5) and its arrival buffer.

A min-heap orders requests for scheduling by a key (by default: effective level, then
predicted remaining time); a max-heap orders the same requests the other way for
eviction. Both hold `(key, seq, version, id)` entries and invalidate lazily: `remove`
and `rekey` bump the request's version, and stale entries are dropped when they reach
a root. Push, pop, remove and re-key are O(log n) amortised. Ties break on `seq`
(arrival order), so every ordering is total and deterministic.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Callable, Generic, Hashable, Iterator, TypeVar

T = TypeVar("T")
Key = tuple


class _Neg:
    """Wraps a key so that heapq's min-heap pops the largest first."""

    __slots__ = ("k",)

    def __init__(self, k: Any) -> None:
        self.k = k

    def __lt__(self, other: "_Neg") -> bool:
        return other.k < self.k

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Neg) and other.k == self.k


class DualHeap(Generic[T]):
    def __init__(self, key: Callable[[T], Key], ident: Callable[[T], Hashable] = lambda x: x.id,
                 seq: Callable[[T], int] = lambda x: x.seq) -> None:
        self._key, self._ident, self._seq = key, ident, seq
        self._min: list = []
        self._max: list = []
        self._live: dict[Hashable, tuple[int, T]] = {}   # id -> (version, item)
        self._version = 0
        self._min_stale = 0
        self._max_stale = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._live

    def __iter__(self) -> Iterator[T]:
        return (item for _, item in self._live.values())

    def get(self, rid: Hashable) -> T | None:
        v = self._live.get(rid)
        return v[1] if v else None

    def push(self, item: T) -> None:
        rid = self._ident(item)
        if rid in self._live:
            raise KeyError(f"{rid!r} is already queued")
        self._version += 1
        v = self._version
        self._live[rid] = (v, item)
        k = (self._key(item), self._seq(item))
        heapq.heappush(self._min, (k, v, rid))
        heapq.heappush(self._max, (_Neg(k), v, rid))

    def remove(self, rid: Hashable) -> T:
        v, item = self._live.pop(rid)
        self._min_stale += 1
        self._max_stale += 1
        self._maybe_compact()
        return item

    def discard(self, rid: Hashable) -> T | None:
        return self.remove(rid) if rid in self._live else None

    def rekey(self, rid: Hashable) -> None:
        """Re-insert after the item's key changed (relabel, new remaining-time estimate)."""
        item = self.remove(rid)
        self.push(item)

    def rekey_all(self) -> None:
        """Rebuild both heaps (a class-table edit changes every key); O(n)."""
        items = [item for _, item in self._live.values()]
        self._min, self._max, self._live = [], [], {}
        self._min_stale = self._max_stale = 0
        for item in items:
            self._version += 1
            rid = self._ident(item)
            self._live[rid] = (self._version, item)
            k = (self._key(item), self._seq(item))
            self._min.append((k, self._version, rid))
            self._max.append((_Neg(k), self._version, rid))
        heapq.heapify(self._min)
        heapq.heapify(self._max)

    def _top(self, heap: list, which: str) -> tuple | None:
        while heap:
            _, v, rid = heap[0]
            live = self._live.get(rid)
            if live is not None and live[0] == v:
                return heap[0]
            heapq.heappop(heap)
            if which == "min":
                self._min_stale -= 1
            else:
                self._max_stale -= 1
        return None

    def peek_min(self) -> T | None:
        e = self._top(self._min, "min")
        return self._live[e[2]][1] if e else None

    def peek_max(self) -> T | None:
        e = self._top(self._max, "max")
        return self._live[e[2]][1] if e else None

    def pop_min(self) -> T:
        e = self._top(self._min, "min")
        if e is None:
            raise IndexError("pop from an empty queue")
        return self.remove(e[2])

    def pop_max(self) -> T:
        e = self._top(self._max, "max")
        if e is None:
            raise IndexError("pop from an empty queue")
        return self.remove(e[2])

    def iter_sorted(self) -> Iterator[tuple[tuple, T]]:
        """Yield (key, item) in scheduling order, lazily, without removing anything.

        Walks the heap array best-first from the root, so the first n items cost
        O(n log n) however long the queue is (seed 004 Alg. 2's ExtractTopb)."""
        h = self._min
        if not h:
            return
        frontier = [(h[0], 0)]
        size = len(h)
        while frontier:
            (k, v, rid), i = heapq.heappop(frontier)
            live = self._live.get(rid)
            if live is not None and live[0] == v:
                yield k, live[1]
            for j in (2 * i + 1, 2 * i + 2):
                if j < size:
                    heapq.heappush(frontier, (h[j], j))

    def smallest(self, n: int) -> list[T]:
        """The n first items in scheduling order, without removing them."""
        out: list[T] = []
        if n > 0:
            for _, item in self.iter_sorted():
                out.append(item)
                if len(out) == n:
                    break
        return out

    def ordered(self) -> list[T]:
        """All items in scheduling order (O(n log n))."""
        return sorted((item for _, item in self._live.values()), key=lambda x: (self._key(x), self._seq(x)))

    def _maybe_compact(self) -> None:
        # keep stale entries bounded: rebuild when they outnumber the live ones
        if self._min_stale > len(self._live) + 64 or self._max_stale > len(self._live) + 64:
            self.rekey_all()


class ArrivalBuffer(Generic[T]):
    """Unsorted buffer that arrivals append to without ever blocking (seed 004 Alg. 1)."""

    def __init__(self) -> None:
        self._q: deque[T] = deque()

    def append(self, item: T) -> None:
        self._q.append(item)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._q))

    def drain_into(self, heap: DualHeap[T], limit: int | None = None) -> int:
        n = 0
        while self._q and (limit is None or n < limit):
            heap.push(self._q.popleft())
            n += 1
        return n
