"""Choosing the next token from the logits: repetition penalty, temperature, top-k, top-p, in
that order (transformers' LogitsProcessor order), then one draw from a seeded generator.

The arithmetic is float64 on the last position's logits, and the draw is one uniform number
per token from NumPy's PCG64 seeded with `seed` (inverse-CDF over the kept tokens in index
order), so a seed gives the same tokens on every backend and machine wherever their logits
agree to float32 rounding. Temperature 0 is greedy (argmax; the lowest index on a tie).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        checks = [("temperature", self.temperature >= 0, "a number >= 0 (0 is greedy)"),
                  ("top_k", isinstance(self.top_k, (int, np.integer)) and self.top_k >= 0, "an integer >= 0 (0: no limit)"),
                  ("top_p", 0 < self.top_p <= 1, "a number in (0, 1]"),
                  ("repetition_penalty", self.repetition_penalty > 0, "a number > 0 (1: none)"),
                  ("seed", self.seed is None or (isinstance(self.seed, (int, np.integer)) and not isinstance(self.seed, bool)
                                                  and 0 <= self.seed < 2**128), "an integer in [0, 2^128)")]
        for name, ok, want in checks:
            if not ok:
                raise InputError(f"{name} must be {want}, got {getattr(self, name)!r}")

    def sampler(self) -> "Sampler":
        return Sampler(self)


class Sampler:
    """One generation's choices: holds the random stream so consecutive tokens draw in order."""

    def __init__(self, params: Sampling):
        self.p = params
        self.rng = np.random.Generator(np.random.PCG64(params.seed))

    def __call__(self, logits: np.ndarray, context: list[int]) -> int:
        x = np.asarray(logits, np.float64).reshape(-1).copy()
        p = self.p
        if p.repetition_penalty != 1.0 and context:
            seen = np.unique(np.asarray(context, np.int64))
            seen = seen[(seen >= 0) & (seen < x.size)]
            s = x[seen]
            x[seen] = np.where(s > 0, s / p.repetition_penalty, s * p.repetition_penalty)
        if p.temperature == 0:
            return int(np.argmax(x))
        # The maximum subtracted before the division: with a temperature near 0 (a subnormal)
        # the division would otherwise overflow to inf - inf = NaN; this way the best logit
        # stays 0 and the others go to -inf (a probability of 0), the limit the temperature
        # approaches. Otherwise the same distribution up to rounding (softmax is shift-invariant).
        x -= x.max()
        with np.errstate(over="ignore"):
            x /= p.temperature
        if p.top_k and p.top_k < x.size:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            x[x < kth] = -np.inf
        probs = np.exp(x)  # (the best logit is 0: no overflow)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = order[:int(np.searchsorted(cum, p.top_p)) + 1]  # the smallest set reaching top_p
            mask = np.zeros(x.size, bool)
            mask[keep] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        u = self.rng.random()
        return int(min(np.searchsorted(np.cumsum(probs), u, side="right"), x.size - 1))
