"""`fcfs-prefill-first` (vLLM v0's default) against `fcfs` (v1) and `sarathi-fcfs`."""
from triage.policies import make_policy
from tests.core.factories import make_request, make_running, make_state


def plan(name, st, now=1.0):
    return make_policy(name).plan(st, now)


def test_a_waiting_prompt_stalls_every_decode_under_prefill_first_only():
    st = make_state(max_tokens=512)
    make_running(st, level=3, rid="d1")
    make_running(st, level=3, rid="d2", arrival=0.1)
    make_request(st, level=3, prompt=300, arrival=0.5, rid="new")
    assert plan("fcfs-prefill-first", st).tokens == {"new": 300}, "prefills only: the decodes wait"
    assert plan("fcfs", st).tokens == {"d1": 1, "d2": 1, "new": 300}
    assert plan("sarathi-fcfs", st).tokens == {"d1": 1, "d2": 1, "new": 300}


def test_prefills_are_admitted_whole_in_arrival_order_until_one_does_not_fit():
    st = make_state(max_tokens=512)
    make_request(st, prompt=200, arrival=0.0, rid="a")
    make_request(st, prompt=400, arrival=0.1, rid="b")      # 200 + 400 > 512: ends the step (no chunk)
    make_request(st, prompt=50, arrival=0.2, rid="c")       # would fit, but FCFS stops at b
    assert plan("fcfs-prefill-first", st).tokens == {"a": 200}
    assert plan("fcfs", st).tokens == {"a": 200, "b": 312}, "v1 chunks the next prompt into the rest"


def test_decode_step_when_nothing_waits_and_recompute_preemption_of_the_latest():
    st = make_state(blocks=14, block_size=16)
    make_running(st, prompt=96, generated=17, rid="old")
    make_running(st, prompt=96, generated=17, rid="new", arrival=0.2)
    p = plan("fcfs-prefill-first", st)
    assert [x.request_id for x in p.preemptions] == ["new"] and p.tokens == {"old": 1}


def test_a_prompt_longer_than_the_budget_is_prefilled_alone_over_several_steps():
    st = make_state(max_tokens=256)
    make_running(st, level=3, rid="dec")
    make_request(st, prompt=600, arrival=0.5, rid="long")
    make_request(st, prompt=10, arrival=0.6, rid="short")
    p = plan("fcfs-prefill-first", st)
    assert p.tokens == {"long": 256}
    st.admit(st.requests["long"], 1.0)
    st.allocate(st.requests["long"], 256)
    st.advance(st.requests["long"], 256, 1.1)
    assert plan("fcfs-prefill-first", st).tokens == {"long": 256}, "its next chunk comes before anything else"
