"""KV block accounting and seed 004's cache-or-recompute rule (Eq. 3, 5, 6)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.kv import CacheCosts, KVCache


def test_blocks_follow_vllm_rules():
    kv = KVCache(num_blocks=10, block_size=16)
    kv.allocate("a", 17)
    assert kv.blocks_of("a") == 2 and kv.free_blocks == 8
    kv.allocate("a", 32)       # still two blocks
    assert kv.blocks_of("a") == 2
    with pytest.raises(MemoryError):
        kv.allocate("b", 16 * 9)
    assert kv.free("a") == 2 and kv.free_blocks == 10


def test_eq3_offloads_prefill_only_when_loading_beats_recomputing():
    c = CacheCosts(alpha1=1e-6, alpha2=1e-4, gamma1=1e-7, gamma2=1e-2, beta=3e-4)
    # β·n < α1·n² + α2·n  <=>  n > (β - α2)/α1 = 200
    assert not c.offload_prefill(150)
    assert c.offload_prefill(250)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 4000), m_prime=st.integers(0, 2000),
       beta=st.floats(1e-5, 1e-2), g1=st.floats(1e-9, 1e-5), g2=st.floats(1e-4, 5e-2))
def test_eq5_numeric_minimum_is_the_stationary_point(n, m_prime, beta, g1, g2):
    c = CacheCosts(alpha1=0.0, alpha2=1e-4, gamma1=g1, gamma2=g2, beta=beta)
    m = c.best_decoded_keep(n, m_prime)
    costs = [c.decoded_cost(n, m_prime, k) for k in range(m_prime + 1)]
    assert c.decoded_cost(n, m_prime, m) == pytest.approx(min(costs), rel=1e-9, abs=1e-12)
    # the continuous optimum of Eq. 5, clamped to [0, m'], is within one token
    assert abs(m - c.stationary_keep(n, m_prime)) <= 1.0 + 1e-9


def test_eq6_as_printed_disagrees_with_eq5_where_loading_is_dear():
    # With loading dearer than one recomputed decode, Eq. 5 says recompute everything
    # (m* = 0); Eq. 6 as printed in seed 004 says save many tokens. We follow Eq. 5.
    c = CacheCosts(alpha1=0.0, alpha2=1e-4, gamma1=1e-7, gamma2=1e-3, beta=5e-2)
    assert c.best_decoded_keep(100, 500) == 0
    assert c.eq6_as_printed(100) > 100
    # Where both clamp (loading cheap, no context), they agree on the boundary sign
    cheap = CacheCosts(alpha1=0.0, alpha2=1e-4, gamma1=1e-7, gamma2=1e-2, beta=1e-5)
    assert cheap.best_decoded_keep(0, 50) == 50


def test_keep_tokens_discards_all_when_prompt_is_cheap_to_recompute():
    c = CacheCosts(alpha1=1e-6, alpha2=1e-4, gamma1=1e-7, gamma2=1e-2, beta=3e-4)
    assert c.keep_tokens(prompt_len=100, computed=150) == 0
    kept = c.keep_tokens(prompt_len=1000, computed=1100)
    assert 1000 <= kept <= 1100
