"""Dual heap (seed 004 Alg. 1, 3): properties against a sorted reference, by hypothesis."""
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from triage.queue import ArrivalBuffer, DualHeap


@dataclass
class Item:
    id: int
    level: int
    rem: float
    seq: int


def heap() -> DualHeap:
    return DualHeap(key=lambda x: (x.level, x.rem))


ops = st.lists(st.tuples(st.sampled_from(["push", "pop_min", "pop_max", "remove", "rekey"]),
                         st.integers(1, 5), st.floats(0, 100, allow_nan=False), st.integers(0, 10**6)),
               max_size=200)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_dual_heap_matches_a_sorted_reference(script):
    h, ref, seq = heap(), {}, 0
    order = lambda it: ((it.level, it.rem), it.seq)  # noqa: E731
    for op, level, rem, pick in script:
        if op == "push":
            it = Item(seq, level, rem, seq)
            seq += 1
            h.push(it)
            ref[it.id] = it
        elif not ref:
            continue
        elif op == "pop_min":
            want = min(ref.values(), key=order)
            assert h.pop_min() is want
            del ref[want.id]
        elif op == "pop_max":
            want = max(ref.values(), key=order)
            assert h.pop_max() is want
            del ref[want.id]
        elif op == "remove":
            victim = sorted(ref)[pick % len(ref)]
            assert h.remove(victim) is ref.pop(victim)
        else:  # relabel: change the key, then re-key
            it = ref[sorted(ref)[pick % len(ref)]]
            it.level, it.rem = level, rem
            h.rekey(it.id)
        assert len(h) == len(ref)
        if ref:
            assert h.peek_min() is min(ref.values(), key=order)
            assert h.peek_max() is max(ref.values(), key=order)
    assert [x.id for x in h.ordered()] == [x.id for x in sorted(ref.values(), key=order)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.floats(0, 10, allow_nan=False)), max_size=80),
       st.integers(0, 90))
def test_smallest_walks_the_heap_in_order_without_popping(items, n):
    h = heap()
    for i, (lv, rem) in enumerate(items):
        h.push(Item(i, lv, rem, i))
    for i in range(0, len(items), 3):  # stale entries must be skipped
        h.remove(i)
    want = [x.id for x in h.ordered()][:n]
    assert [x.id for x in h.smallest(n)] == want
    assert len(h) == len(items) - len(range(0, len(items), 3))


def test_duplicate_push_is_refused_and_ties_break_by_arrival():
    h = heap()
    a, b = Item(1, 2, 1.0, 0), Item(2, 2, 1.0, 1)
    h.push(b)
    h.push(a)
    assert h.pop_min() is a and h.peek_max() is b
    try:
        h.push(b)
    except KeyError:
        pass
    else:
        raise AssertionError("pushing a queued id twice must fail")


def test_arrival_buffer_drains_in_arrival_order():
    buf, h = ArrivalBuffer(), heap()
    for i in range(5):
        buf.append(Item(i, 5 - i, 0.0, i))
    assert buf.drain_into(h, limit=2) == 2 and len(buf) == 3
    buf.drain_into(h)
    assert [h.pop_min().id for _ in range(5)] == [4, 3, 2, 1, 0]
