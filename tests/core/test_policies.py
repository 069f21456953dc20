"""Table-driven tests of each policy on hand-built states."""
import pytest

from triage.policies import POLICIES, make_policy
from tests.core.factories import make_request, make_running, make_state


def plan(name, st, now=1.0, **kw):
    return make_policy(name, **kw).plan(st, now)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_empty_state_gives_an_empty_plan(name):
    assert not plan(name, make_state())


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_respects_token_and_seat_budgets(name):
    st = make_state(max_seqs=4, max_tokens=300)
    for i in range(8):
        make_request(st, level=1 + i % 5, prompt=120, arrival=0.01 * i)
    p = plan(name, st)
    assert 0 < p.total_tokens <= 300
    assert len(p.tokens) <= 4
    assert all(k > 0 for k in p.tokens.values())


@pytest.mark.parametrize("name, first", [
    ("fcfs", "early5"), ("sarathi-fcfs", "early5"), ("sarathi-priority", "late1"),
    ("hpjf", "late1"), ("semantic", "late1"), ("triage", "late1"),
])
def test_who_is_admitted_first_under_a_tight_token_budget(name, first):
    st = make_state(max_tokens=100)
    make_request(st, level=5, prompt=100, arrival=0.0, rid="early5")
    make_request(st, level=1, prompt=100, arrival=0.5, rid="late1")
    p = plan(name, st)
    assert list(p.tokens) == [first]


@pytest.mark.parametrize("name", ["sarathi-fcfs", "sarathi-priority"])
def test_sarathi_serves_decodes_before_prefill_chunks(name):
    st = make_state(max_tokens=64)
    make_request(st, level=1, prompt=500, arrival=0.0, rid="big")
    st.admit(st.requests["big"], 0.0)  # running, prefill not started
    d = make_running(st, level=5, arrival=0.1, rid="dec")
    p = plan(name, st)
    assert list(p.tokens)[0] == "dec" and p.tokens["dec"] == 1
    assert p.tokens["big"] == 63  # the rest of the budget, chunked


def test_fcfs_preempts_the_most_recently_admitted_when_kv_runs_out():
    st = make_state(blocks=14, block_size=16)
    make_running(st, prompt=96, generated=17, rid="old")    # 7 full blocks; the next token needs an 8th
    make_running(st, prompt=96, generated=17, rid="new", arrival=0.2)
    assert st.kv.free_blocks == 0
    p = plan("fcfs", st)
    assert [x.request_id for x in p.preemptions] == ["new"]
    assert p.preemptions[0].mode == "recompute"
    assert p.tokens == {"old": 1}


def test_hpjf_evicts_lower_priority_for_a_level_1_arrival_but_never_higher():
    st = make_state(blocks=14, block_size=16)
    make_running(st, level=2, prompt=96, generated=16, rid="l2")
    make_running(st, level=5, prompt=96, generated=16, rid="l5")
    make_request(st, level=1, prompt=90, arrival=0.5, rid="l1")
    p = plan("hpjf", st)
    assert [x.request_id for x in p.preemptions] == ["l5"]
    assert "l1" in p.tokens and "l2" in p.tokens


def test_semantic_is_stage_aware_and_offloads_long_victims():
    st = make_state(blocks=400, block_size=16, kv_load=1e-6)
    make_running(st, level=1, prompt=200, rid="vip")             # p* is decoding ...
    make_request(st, level=3, prompt=100, arrival=0.5, rid="new")
    p = plan("semantic", st)
    assert p.tokens == {"vip": 1}                                 # ... so no prefill joins
    p2 = plan("semantic", st, stage_aware=False)
    assert set(p2.tokens) == {"vip", "new"}


def test_semantic_eviction_uses_cache_or_recompute():
    # loading is cheap (β tiny): the victim's KV is offloaded, not discarded
    st = make_state(blocks=30, block_size=16, max_seqs=2, kv_load=1e-7)
    make_running(st, level=1, prompt=200, rid="vip")
    make_running(st, level=5, prompt=200, rid="victim", arrival=0.1)
    make_request(st, level=2, prompt=100, arrival=0.5, rid="urgent")
    p = plan("semantic", st, stage_aware=False)  # stage-aware would hold "urgent" back behind vip's decode
    assert [x.request_id for x in p.preemptions] == ["victim"]
    assert p.preemptions[0].mode == "offload" and p.preemptions[0].keep_tokens > 0
    assert "urgent" in p.tokens


def test_triage_level1_arrival_preempts_at_max_num_seqs():
    st = make_state(max_seqs=2, kv_load=10.0)  # loading dear: recompute
    make_running(st, level=4, rid="a")
    make_running(st, level=5, rid="b", arrival=0.1)
    make_request(st, level=1, prompt=50, arrival=0.9, rid="crit")
    p = plan("triage", st)
    assert [x.request_id for x in p.preemptions] == ["b"]
    assert p.preemptions[0].mode == "recompute"
    assert "crit" in p.tokens and list(p.tokens)[0] == "crit"


def test_triage_does_not_preempt_for_a_less_urgent_arrival():
    st = make_state(max_seqs=2)
    make_running(st, level=2, rid="a")
    make_running(st, level=3, rid="b", arrival=0.1)
    make_request(st, level=4, prompt=50, arrival=0.9, rid="late")
    p = plan("triage", st)
    assert not p.preemptions and "late" not in p.tokens


@pytest.mark.parametrize("name", ["slidebatching", "triage"])
def test_time_budget_bounds_the_step(name):
    st = make_state()
    for i in range(6):
        make_request(st, level=3, prompt=2000, arrival=0.0, rid=f"p{i}")
    p = plan(name, st, now=0.0, eta=0.05)
    # the budget is the smallest slack (4 s); its plan's predicted time stays within it
    assert p.budget_s == pytest.approx(4.0)
    assert p.predicted_s <= p.budget_s + 1e-9


def test_triage_keeps_steps_short_while_a_level1_request_decodes():
    """An ESI-1 decode (TPOT 0.1 s, last token at t=0.1) beside a long prompt: with safety
    2 the step is planned to end within half of the 0.1 s gap (a real step may run twice
    its prediction); without a protected decode the prompt gets the whole budget."""
    def build(level):
        st = make_state()
        make_running(st, level=level, rid="dec", arrival=0.0, generated=6)   # last token at 0.1
        make_request(st, level=3, prompt=5000, arrival=0.0, rid="long")
        return st

    plain = plan("triage", build(3), now=0.1, eta=0.3, safety=2.0)
    guarded = plan("triage", build(1), now=0.1, eta=0.3, safety=2.0)
    assert plain.predicted_s > 0.2, "no protected decode: eta sizes the step"
    assert guarded.tokens["dec"] == 1 and "long" in guarded.tokens
    assert guarded.predicted_s <= 0.1 / 2.0 + 1e-9
    with pytest.raises(ValueError, match="safety"):
        plan("triage", build(1), safety=0.5)
    # protected_pace 0.25: the step is planned for a quarter of the TPOT SLO (0.025 s), not
    # the 0.1 s gap, so the ESI-1 answer streams faster than its SLO; the prompt still moves
    paced = plan("triage", build(1), now=0.1, eta=0.3, protected_pace=0.25)
    at_slo = plan("triage", build(1), now=0.1, eta=0.3)
    assert paced.tokens["dec"] == 1 and 0 < paced.tokens["long"] < at_slo.tokens["long"]
    assert paced.predicted_s <= 0.025 + 1e-9 < at_slo.predicted_s
    with pytest.raises(ValueError, match="protected_pace"):
        plan("triage", build(1), protected_pace=0)


def test_slidebatching_urgent_requests_go_by_density():
    # one request is already late (urgent, small remain); two others have slack
    st = make_state(max_tokens=100)
    make_request(st, level=5, prompt=100, arrival=-20.0, rid="late5")   # deadline passed
    make_request(st, level=1, prompt=100, arrival=-0.98, rid="tight1")  # 0.02 s left: < γ·φa
    make_request(st, level=3, prompt=100, arrival=0.0, rid="slack3")
    p = plan("slidebatching", st, now=0.0)
    # both late5 and tight1 are URGENT; tight1 has 16x the density
    assert list(p.tokens)[0] == "tight1"


def test_relabel_moves_a_waiting_request_ahead_at_the_next_step():
    st = make_state(max_tokens=100)
    make_request(st, level=4, prompt=100, arrival=0.0, rid="first")
    make_request(st, level=4, prompt=100, arrival=0.1, rid="second")
    assert list(plan("triage", st).tokens) == ["first"]
    st.relabel("second", 1)
    assert list(plan("triage", st).tokens) == ["second"]
    assert st.requests["second"].level == 1 and st.requests["second"].predicted_level == 4


LIVE = dict(order="level", evict_for="level")


def test_level_order_any_more_urgent_arrival_preempts_at_the_seat_limit():
    """Every seat held by less urgent work: a level-2 arrival displaces the least urgent
    running request (level 5 before level 4), and runs this step."""
    st = make_state(max_seqs=2)
    make_running(st, level=4, rid="a")
    make_running(st, level=5, rid="b", arrival=0.1)
    make_request(st, level=2, prompt=50, arrival=0.9, rid="two")
    p = plan("triage", st, **LIVE)
    assert [x.request_id for x in p.preemptions] == ["b"]
    assert "two" in p.tokens and p.tokens["a"] == 1


def test_level_order_never_preempts_for_an_equal_or_less_urgent_arrival():
    st = make_state(max_seqs=2)
    make_running(st, level=3, rid="a")
    make_running(st, level=3, rid="b", arrival=0.1)
    make_request(st, level=3, prompt=50, arrival=0.9, rid="same")
    make_request(st, level=5, prompt=50, arrival=0.9, rid="less")
    p = plan("triage", st, **LIVE)
    assert not p.preemptions and set(p.tokens) == {"a", "b"}


def test_level_order_bounds_preemptions_per_request():
    """A request already preempted max_preemptions times keeps its seat; the urgent
    arrival waits for another victim instead of evicting it a third time."""
    st = make_state(max_seqs=1)
    r = make_running(st, level=5, rid="victim")
    r.preemptions = 2
    make_request(st, level=1, prompt=50, arrival=0.9, rid="crit")
    p = plan("triage", st, max_preemptions=2, **LIVE)
    assert not p.preemptions and "crit" not in p.tokens
    r.preemptions = 1
    p = plan("triage", st, max_preemptions=2, **LIVE)
    assert [x.request_id for x in p.preemptions] == ["victim"] and "crit" in p.tokens


def test_level_order_resumes_a_preempted_request_first_within_its_level():
    st = make_state(max_seqs=4, max_tokens=60)
    make_request(st, level=3, prompt=50, arrival=0.0, rid="new")
    old = make_running(st, level=3, prompt=50, arrival=0.5, rid="old")
    st.preempt("old", 0)
    assert old.preemptions == 1
    p = plan("triage", st, **LIVE)
    assert list(p.tokens)[0] == "old"


def test_resume_before_lets_an_evicted_stream_resume_ahead_of_fresh_calls_with_room():
    """resume_before f: a preempted level-5 stream takes the free seat ahead of a fresh
    level-3 call that still has more than f x its 4 s TTFT SLO left (without the option it
    waits behind it, stalled mid-answer); once that call is short of room, it goes first.
    Fresh calls keep their order among themselves."""
    kw = dict(order="level", evict_for="deadline")

    def state(three_arrival):
        st = make_state(max_seqs=2)
        make_running(st, level=4, rid="run", output=7)        # its seat frees by itself soon
        make_running(st, level=5, rid="victim", output=500, arrival=0.2)
        st.preempt("victim", 0)
        make_request(st, level=3, prompt=50, arrival=three_arrival, rid="three")
        make_request(st, level=4, prompt=50, arrival=three_arrival, rid="four")
        return st

    roomy = state(three_arrival=9.5)                          # 3.5 s of its 4 s left at t=10
    assert "three" in plan("triage", roomy, now=10.0, **kw).tokens       # default: the fresh call first
    p = plan("triage", roomy, now=10.0, resume_before=0.5, **kw)
    assert "victim" in p.tokens and "three" not in p.tokens and not p.preemptions
    tight = state(three_arrival=7.0)                          # 1 s left: less than half its SLO
    p = plan("triage", tight, now=10.0, resume_before=0.5, **kw)
    assert "three" in p.tokens and "victim" not in p.tokens
    with pytest.raises(ValueError, match="resume_before"):
        plan("triage", roomy, resume_before=1.5, **kw)


def test_level_order_runs_every_decode_and_caps_the_step():
    """Decodes first (they keep the seats productive), then prefill by level within
    max_step_s; the cap never drops a running decode."""
    st = make_state()
    for i in range(4):
        make_running(st, level=5, rid=f"d{i}", arrival=0.01 * i)
    make_request(st, level=4, prompt=5000, arrival=0.0, rid="long4")
    make_request(st, level=2, prompt=5000, arrival=0.5, rid="long2")
    p = plan("triage", st, now=1.0, eta=5.0, max_step_s=0.1, **LIVE)
    assert all(p.tokens[f"d{i}"] == 1 for i in range(4))
    assert "long2" in p.tokens and "long4" not in p.tokens
    assert p.predicted_s <= 0.1 + 1e-9
    tight = plan("triage", st, now=1.0, eta=5.0, max_step_s=0.001, **LIVE)
    assert all(tight.tokens.get(f"d{i}") == 1 for i in range(4)), "the cap never drops a running decode"
    # the cap is the profiled machine's time: on a machine the online correction finds 2x
    # faster (beta 0.5) the same cap allows half the seconds, and about as much work
    st.estimator.beta = 0.5
    fast = plan("triage", st, now=1.0, eta=5.0, max_step_s=0.1, **LIVE)
    assert fast.predicted_s <= 0.05 + 1e-9 and fast.tokens["long2"] == pytest.approx(p.tokens["long2"], rel=0.1)


def test_deadline_eviction_displaces_only_when_the_natural_seat_is_too_late():
    """evict_for="deadline": a level-3 arrival waits for a seat that frees by itself in time
    (no recompute), displaces a level-5 request that would hold the seat past its
    first-token deadline; a level-1 arrival always displaces."""
    kw = dict(order="level", evict_for="deadline")
    st = make_state(max_seqs=1)
    make_running(st, level=5, rid="ending", output=7)        # 2 tokens left: the seat frees in ~2 steps
    make_request(st, level=3, prompt=50, arrival=0.9, rid="three")
    p = plan("triage", st, **kw)
    assert not p.preemptions and "three" not in p.tokens
    assert [x.request_id for x in plan("triage", st, evict_for="level", order="level").preemptions] == ["ending"]
    make_request(st, level=1, prompt=50, arrival=0.95, rid="crit")
    p = plan("triage", st, **kw)
    assert [x.request_id for x in p.preemptions] == ["ending"] and "crit" in p.tokens

    st = make_state(max_seqs=1)
    make_running(st, level=5, rid="long", output=2000)       # holds the seat far past level 3's 4 s
    make_request(st, level=3, prompt=50, arrival=0.9, rid="three")
    p = plan("triage", st, **kw)
    assert [x.request_id for x in p.preemptions] == ["long"] and "three" in p.tokens


def test_a_step_that_ends_with_an_esi1_first_token_carries_no_other_prefill():
    """short_first_step: the step in which a level-1 prompt completes runs it and the running
    decodes only, so its first token does not wait for other prompts to fill the step; the
    level-3 prompt runs the step after. Turned off, the level-3 prompt shares the step."""
    st = make_state(max_seqs=8)
    make_running(st, level=5, rid="dec")
    make_request(st, level=1, prompt=40, arrival=0.9, rid="crit")
    make_request(st, level=3, prompt=200, arrival=0.5, rid="three")
    p = plan("triage", st, **LIVE)
    assert set(p.tokens) == {"dec", "crit"} and p.tokens["crit"] == 40
    assert set(plan("triage", st, short_first_step=False, **LIVE).tokens) == {"dec", "crit", "three"}
    # solo_first_step: not even the running level-5 decode shares that step (it runs the next)
    assert set(plan("triage", st, solo_first_step=True, **LIVE).tokens) == {"crit"}
    st = make_state(max_seqs=8)                               # no urgent prompt: the step is filled as before
    make_running(st, level=5, rid="dec")
    make_request(st, level=3, prompt=200, arrival=0.5, rid="three")
    assert set(plan("triage", st, **LIVE).tokens) == {"dec", "three"}


def test_first_step_slack_lets_the_urgent_first_step_carry_a_bounded_prefill():
    """first_step_slack k: the step that ends with a level-1 first token may carry lower
    prefill worth up to k step fixed costs (t_c = 10 ms, 0.1 ms a prefill token here: 100
    tokens a t_c), so the first token waits at most k x t_c longer, not a whole step."""
    st = make_state(max_seqs=8)
    make_running(st, level=5, rid="dec")
    make_request(st, level=1, prompt=40, arrival=0.9, rid="crit")
    make_request(st, level=3, prompt=400, arrival=0.5, rid="three")
    short = plan("triage", st, **LIVE)
    one = plan("triage", st, first_step_slack=1.0, **LIVE)
    two = plan("triage", st, first_step_slack=2.0, **LIVE)
    full = plan("triage", st, short_first_step=False, **LIVE)
    assert "three" not in short.tokens and one.tokens["crit"] == 40 and one.tokens["dec"] == 1
    assert 0 < one.tokens["three"] <= 101 and one.tokens["three"] < two.tokens["three"] <= 201
    assert full.tokens["three"] == 400
    assert one.predicted_s <= short.predicted_s + 0.01 + 1e-6 < full.predicted_s
    with pytest.raises(ValueError, match="first_step_slack"):
        plan("triage", st, first_step_slack=-1.0, **LIVE)


def test_a_protected_prompt_is_not_split_by_the_step_time():
    """unsplit_prompts (order="level"): two level-1 prompts of 400 tokens (40 ms each with
    these costs) and a step with time for 1.5 of them: the first runs whole and the second
    waits whole for the next step, instead of taking 200 tokens now and paying a whole
    extra step for the other 200 (its first token comes at the end of the next step
    either way; the first one's comes sooner)."""
    st = make_state()
    make_request(st, level=1, prompt=400, arrival=0.90, rid="a")
    make_request(st, level=1, prompt=400, arrival=0.91, rid="b")
    cap = 0.01 + 0.06                                          # t_c + 600 tokens of prefill
    assert plan("triage", st, eta=5.0, max_step_s=cap, **LIVE).tokens == {"a": 400}
    split = plan("triage", st, eta=5.0, max_step_s=cap, unsplit_prompts=False, **LIVE).tokens
    assert split["a"] == 400 and split["b"] == pytest.approx(200, abs=1)
    # the step's first prompt is chunked all the same (a prompt longer than any step progresses)
    st = make_state()
    make_request(st, level=1, prompt=2000, arrival=0.9, rid="long")
    assert 0 < plan("triage", st, eta=5.0, max_step_s=cap, **LIVE).tokens["long"] < 2000


def test_a_protected_first_prompt_runs_whole_when_its_rest_costs_less_than_a_decode_step():
    """Eight level-1 answers decoding (t_c 10 ms + 8 x 1 ms: an 18-ms step of decodes) and a
    level-1 prompt of 330 tokens (33 ms) where the step has time for ~210 of them: the rest
    (12 ms) costs more than t_c but less than the decode step that splitting it would add
    before its first token, so it runs whole now. A prompt whose rest would take longer than
    that step is chunked as before, so a step overshoots its budget by one decode step at most."""
    def state(prompt):
        st = make_state(max_seqs=16)
        for k in range(8):
            make_running(st, level=1, rid=f"dec{k}", arrival=0.95)   # their next tokens are due in 0.1 s
        make_request(st, level=1, prompt=prompt, arrival=0.9, rid="crit")
        return st
    cap = 0.01 + 0.008 + 0.02                                  # t_c + the decodes + 200 prompt tokens
    whole = plan("triage", state(330), eta=5.0, max_step_s=cap, **LIVE)
    assert whole.tokens["crit"] == 330 and all(whole.tokens[f"dec{k}"] == 1 for k in range(8))
    assert whole.budget_s < whole.predicted_s <= whole.budget_s + 0.018 + 1e-9
    split = plan("triage", state(330), eta=5.0, max_step_s=cap, unsplit_prompts=False, **LIVE)
    assert split.tokens["crit"] == pytest.approx(210, abs=2)   # the rule off: 210 now, 120 a step later
    cut = plan("triage", state(420), eta=5.0, max_step_s=cap, **LIVE)   # a rest of ~210 tokens: 21 ms
    assert cut.tokens["crit"] == pytest.approx(210, abs=2) and cut.predicted_s <= cut.budget_s + 1e-9


def test_no_prompt_is_left_with_a_rest_cheaper_than_a_step():
    """A chunk whose rest would cost less than the step's fixed time t_c (10 ms = 100
    tokens here) takes the whole prompt: the rest would cost the request one more step."""
    st = make_state()
    make_request(st, level=3, prompt=1000, arrival=0.5, rid="three")
    cap = 0.01 + 0.095                                         # t_c + 950 tokens
    assert plan("triage", st, eta=5.0, max_step_s=cap, **LIVE).tokens["three"] == 1000
    assert plan("triage", st, eta=5.0, max_step_s=cap, unsplit_prompts=False, **LIVE).tokens["three"] == pytest.approx(950, abs=1)
    cap = 0.01 + 0.05                                          # a rest of 500 tokens: chunked as before
    assert plan("triage", st, eta=5.0, max_step_s=cap, **LIVE).tokens["three"] == pytest.approx(500, abs=1)


@pytest.mark.parametrize("kw", [dict(order="x"), dict(max_step_s=0), dict(max_preemptions=-1), dict(evict_for="x"),
                                dict(evict_for="deadline", order="slide")])
def test_triage_refuses_bad_parameters(kw):
    with pytest.raises(ValueError):
        make_policy("triage", **kw)


def test_level_order_frees_kv_for_a_running_request_even_past_the_preemption_bound():
    """KV full and the next decode needs a block: a running request is preempted (as vLLM
    would), even when every candidate has reached max_preemptions, or the engine stalls."""
    st = make_state(blocks=14, block_size=16)
    old = make_running(st, level=3, prompt=96, generated=17, rid="old")
    new = make_running(st, level=3, prompt=96, generated=17, rid="new", arrival=0.2)
    old.preemptions = new.preemptions = 5
    assert st.kv.free_blocks == 0
    p = plan("triage", st, **LIVE)
    assert len(p.preemptions) == 1 and len(p.tokens) == 1
    assert set(p.tokens) | {p.preemptions[0].request_id} == {"old", "new"}
