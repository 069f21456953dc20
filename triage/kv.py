"""KV block accounting and the cache-or-recompute decision (seed 004 §3.3).

Blocks follow vLLM's rules: a request holding `t` tokens of KV owns ceil(t / block_size)
blocks; admitting a waiting request reserves blocks for its whole prompt at once
(vLLM's `scheduler_reserve_full_isl`).
"""
from __future__ import annotations

from dataclasses import dataclass


class KVCache:
    """Device block pool: who holds how many blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._held: dict[str, int] = {}
        self.used = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.used

    def blocks_of(self, rid: str) -> int:
        return self._held.get(rid, 0)

    def extra_blocks(self, rid: str, total_tokens: int) -> int:
        """Blocks to add so that `rid` holds KV for `total_tokens` tokens."""
        return max(0, self.blocks_for(total_tokens) - self._held.get(rid, 0))

    def allocate(self, rid: str, total_tokens: int) -> None:
        extra = self.extra_blocks(rid, total_tokens)
        if extra > self.free_blocks:
            raise MemoryError(f"KV over capacity: {rid} needs {extra} blocks, {self.free_blocks} free")
        if extra:
            self._held[rid] = self._held.get(rid, 0) + extra
            self.used += extra

    def free(self, rid: str) -> int:
        n = self._held.pop(rid, 0)
        self.used -= n
        return n

    def holders(self) -> dict[str, int]:
        return dict(self._held)


@dataclass(frozen=True, slots=True)
class CacheCosts:
    """Seed 004 cost model. Prefill: α1·n² + α2·n; the m'-th decoded token after a
    prompt of n: γ1·(n + m' - 1) + γ2; moving one token of KV to or from host: β."""

    alpha1: float
    alpha2: float
    gamma1: float
    gamma2: float
    beta: float

    @classmethod
    def from_estimator(cls, est, beta: float) -> "CacheCosts":
        """Read α/γ off a ProServe-form estimator (a_p, c_p, a_d; b_d + t_c as γ2)."""
        return cls(est.a_p, est.c_p, est.a_d, est.b_d + est.t_c, beta)

    def offload_prefill(self, n: int) -> bool:
        """Eq. 3: keep (offload) n prefill tokens when β·n < α1·n² + α2·n.

        Seed 004 prints Eq. 3 the other way round ("if βn > α1·n² + α2·n, then caching
        is more efficient"); that would offload exactly when moving the KV costs *more*
        than recomputing it. Its own text ("whether recomputation is cheaper than
        incurring the overhead of cache saving and loading") and Eq. 5's cost of saving
        m* tokens (β·m*) fix the direction used here: cache when loading is cheaper
        than recomputing. (tests/core/test_kv.py checks both ends.)"""
        return n > 0 and self.beta * n < self.alpha1 * n * n + self.alpha2 * n

    def decoded_cost(self, n: int, m_prime: int, m_star: int) -> float:
        """Eq. 5: save m* of the m' decoded tokens, recompute the other m' - m*."""
        x = m_prime - m_star
        return self.beta * m_star + self.gamma1 * (0.5 * x * x + n * x + 0.5 * x) + self.gamma2 * x

    def best_decoded_keep(self, n: int, m_prime: int) -> int:
        """m* minimising Eq. 5 over integers 0..m' (convex in m*: integer ternary search)."""
        lo, hi = 0, m_prime
        f = lambda m: self.decoded_cost(n, m_prime, m)  # noqa: E731
        while hi - lo > 2:
            m1 = lo + (hi - lo) // 3
            m2 = hi - (hi - lo) // 3
            if f(m1) <= f(m2):
                hi = m2
            else:
                lo = m1
        return min(range(lo, hi + 1), key=lambda m: (f(m), -m))

    def stationary_keep(self, n: int, m_prime: int) -> float:
        """Where dEq5/dm* = 0: m* = m' - ((β - γ2)/γ1 - n - 1/2), clamped to [0, m'].

        Seed 004 prints Eq. 6 as m* = max(0, (β - γ1·n - (γ1 + 2γ2)/2) / (2γ1)); that does
        not zero the derivative of its own Eq. 5 (it grows with β, while saving must get
        less attractive as loading gets dearer), so we check the numeric minimum against
        this derivation instead and report Eq. 6 beside it (`eq6_as_printed`).
        """
        if self.gamma1 <= 0:
            return float(m_prime if self.beta < self.gamma2 else 0)
        x = (self.beta - self.gamma2) / self.gamma1 - n - 0.5
        return min(float(m_prime), max(0.0, m_prime - x))

    def eq6_as_printed(self, n: int) -> float:
        return max(0.0, (self.beta - self.gamma1 * n - (self.gamma1 + 2 * self.gamma2) / 2) / (2 * self.gamma1))

    def keep_tokens(self, prompt_len: int, computed: int) -> int:
        """How many of a victim's `computed` tokens to offload (the rest is recomputed)."""
        n = min(prompt_len, computed)
        if not self.offload_prefill(n):
            return 0  # recomputing the prompt is cheaper: discard everything
        m_prime = max(0, computed - prompt_len)
        return n + self.best_decoded_keep(n, m_prime)
