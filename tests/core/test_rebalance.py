"""Seat stealing (triage.routing.rebalance): which waiting calls move, where, and what it
buys in the simulator when the length head is wrong."""
from __future__ import annotations

from dataclasses import dataclass, field

from triage.classes import load_classes
from triage.profiles import load_profile
from triage.routing.rebalance import seat_moves
from triage.sim.cluster import simulate_cluster
from triage.sim.simulator import with_limits
from triage.sim.traces import TraceRequest


@dataclass
class Inst:
    index: int
    seats: int | None
    n_running: int
    calls: list = field(default_factory=list)   # waiting, not started: (id, level, slack, waited s, tokens)
    extra_waiting: int = 0                      # waiting calls it cannot give away (started, or not ours)
    running_tokens: int = 0                     # predicted output tokens its running calls still owe
    role: str = "mixed"

    @property
    def output_tokens_left(self) -> int:
        return self.running_tokens + sum(c[4] for c in self.calls)

    @property
    def n_waiting(self) -> int:
        return len(self.calls) + self.extra_waiting

    def waiting_calls(self, now):
        return list(self.calls)


def test_a_free_seat_takes_the_call_its_instance_would_serve_last():
    busy = Inst(0, seats=4, n_running=4, calls=[("a5", 5, 20.0, 1.0, 100), ("b3", 3, 3.0, 1.0, 100),
                                                ("c5", 5, 25.0, 1.0, 100)], running_tokens=800)
    free = Inst(1, seats=4, n_running=2, running_tokens=20)
    assert seat_moves([busy, free], 0.0) == [("c5", 0, 1), ("a5", 0, 1)]      # two seats: the two served last
    assert seat_moves([busy, free], 0.0, moved={"c5"}) == [("a5", 0, 1), ("b3", 0, 1)]   # a call moves once
    assert seat_moves([busy, free], 0.0, to=0) == []


def test_no_move_without_a_free_idle_seat_or_a_call_that_waited():
    calls = [("a", 5, 9.0, 1.0, 100)]
    # the free instance has its own queue: its seats are spoken for
    assert seat_moves([Inst(0, 4, 4, list(calls), running_tokens=800), Inst(1, 4, 2, extra_waiting=1)], 0.0) == []
    # a call just sent: its instance admits it at the next step
    assert seat_moves([Inst(0, 4, 4, [("a", 5, 9.0, 0.1, 100)], running_tokens=800), Inst(1, 4, 0)], 0.0) == []
    assert seat_moves([Inst(0, 4, 4, list(calls), running_tokens=800), Inst(1, 4, 0)], 0.0) == [("a", 0, 1)]
    # a move that would leave the free instance the busier one
    assert seat_moves([Inst(0, 4, 4, list(calls), running_tokens=90), Inst(1, 4, 2, running_tokens=100)], 0.0) == []
    # seats unknown (stock vLLM): no part in it
    assert seat_moves([Inst(0, None, 4, list(calls)), Inst(1, 4, 0)], 0.0) == []
    assert seat_moves([Inst(0, 4, 4, list(calls)), Inst(1, None, 0)], 0.0) == []
    # several free instances: the one with the fewest tokens still to produce first
    two = [("a", 5, 9.0, 1.0, 100), ("b", 5, 8.0, 1.0, 100)]
    assert seat_moves([Inst(0, 4, 4, two, running_tokens=800), Inst(1, 4, 3, running_tokens=30),
                       Inst(2, 4, 1, running_tokens=50)], 0.0) == [("a", 0, 1), ("b", 0, 2)]   # 1 has one seat


def test_only_what_lowers_the_busier_instance_moves():
    """The instance a call waits on frees seats itself as its running calls finish: a free
    neighbour takes its waiting calls only while each move lowers the larger of the two
    instances' predicted output tokens still to come, not every call it has seats for."""
    calls = [(f"c{k}", 5, 10.0 + k, 1.0, 40) for k in range(6)]            # 240 tokens waiting
    nearly_done = Inst(0, seats=8, n_running=8, calls=calls, running_tokens=16)   # 2 tokens each left
    moves = seat_moves([nearly_done, Inst(1, seats=8, n_running=0)], 0.0)
    assert [m[0] for m in moves] == ["c5", "c4", "c3"]                     # 256 -> 136 there, 0 -> 120 here
    long_running = Inst(0, seats=8, n_running=8, calls=list(calls), running_tokens=8 * 200)
    assert len(seat_moves([long_running, Inst(1, seats=8, n_running=0)], 0.0)) == 6


def test_stealing_shortens_the_tail_a_placement_by_count_left():
    """Simulated (vllm-cpu-smollm2 profile, 2 instances of 2 seats, round robin): eight calls
    at once, the ones round robin sends to instance 0 answer 150 tokens, the others 5 (the
    length head right). Placed once, instance 0 serves two waves of long calls while
    instance 1 idles; with stealing instance 1 takes the two long calls still waiting."""
    prof = with_limits(load_profile("vllm-cpu-smollm2"), max_num_seqs=2)
    classes = load_classes().scaled(prof.slo_scale)
    trace = [TraceRequest(0.001 * k, 50, 150 if k % 2 == 0 else 5, 4) for k in range(8)]
    runs = {}
    for steal in (False, True):
        res = simulate_cluster(trace, "triage", prof, classes, instances=2, router="round_robin", steal=steal)
        assert len(res.requests) == 8
        assert sum(len(r.token_times) for r in res.requests) == 4 * 150 + 4 * 5
        runs[steal] = res
    placed, stolen = runs[False].sim_time, runs[True].sim_time
    assert stolen < 0.7 * placed, (placed, stolen)
    assert sorted(r.instance for r in runs[True].requests if r.output_len == 150) == [0, 0, 1, 1]
