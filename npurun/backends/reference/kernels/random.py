"""Reference kernels of the random ops (ir/ops/random.py): NumPy's PCG64 generator.

A seeded node seeds a fresh generator on every call, so each run draws the same values; an
unseeded one takes fresh OS entropy each call. Draws are made in float64 and rounded once to
the result type.
"""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import to_numpy
from . import kernel


def generator(seed) -> np.random.Generator:
    """The generator of one run of a node with this `seed` attribute (None: unseeded)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(seed_value(seed))


def seed_value(seed) -> int:
    """An ONNX seed (a float for the random ops, an int for Dropout) as a non-negative int: an
    integral value is that integer (so seed=3 and seed=3.0 give one stream), any other float
    its IEEE bits; negative ones wrap modulo 2**64."""
    if isinstance(seed, (bool, np.bool_)):
        seed = int(seed)
    if isinstance(seed, (int, np.integer)):
        return int(seed) % (1 << 64)
    f = float(seed)
    if math.isfinite(f) and f.is_integer():
        return int(f) % (1 << 64)
    return int(np.float64(f).view(np.uint64))


def _out(dtype, like=None):
    return to_numpy(dtype) if dtype else like.dtype


@kernel("random_normal")
def random_normal(*, shape, dtype, mean, scale, seed):
    return generator(seed).normal(mean, scale, tuple(shape)).astype(to_numpy(dtype))


@kernel("random_uniform")
def random_uniform(*, shape, dtype, low, high, seed):
    return generator(seed).uniform(low, high, tuple(shape)).astype(to_numpy(dtype))


@kernel("random_normal_like")
def random_normal_like(x, *, dtype, mean, scale, seed):
    return generator(seed).normal(mean, scale, x.shape).astype(_out(dtype, x))


@kernel("random_uniform_like")
def random_uniform_like(x, *, dtype, low, high, seed):
    return generator(seed).uniform(low, high, x.shape).astype(_out(dtype, x))


@kernel("bernoulli")
def bernoulli(p, *, dtype, seed):
    q = p.astype(np.float64)
    if not (np.all(q >= 0) and np.all(q <= 1)):  # NaN fails both
        raise ValueError("bernoulli probabilities must lie in [0, 1]")
    return (generator(seed).random(q.shape) < q).astype(_out(dtype, p))


@kernel("multinomial")
def multinomial(logits, *, dtype, sample_size, seed):
    # logits is (B, C): per row, softmax probabilities; draws by inverting the row's CDF.
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    if x.shape[1] == 0 or not np.all(np.isfinite(top)):
        raise ValueError("multinomial: every batch row needs a finite logit (a class to draw)")
    cdf = np.cumsum(np.exp(x - top), axis=1)
    u = generator(seed).random((x.shape[0], sample_size)) * cdf[:, -1:]
    out = np.empty((x.shape[0], sample_size), dtype=to_numpy(dtype))
    for b in range(x.shape[0]):
        out[b] = np.minimum(np.searchsorted(cdf[b], u[b], side="right"), x.shape[1] - 1)
    return out


@kernel("dropout")
def dropout(x, ratio=None, training_mode=None, *, seed):
    r = 0.5 if ratio is None else float(np.asarray(ratio, dtype=np.float64).reshape(-1)[0])
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(-1)[0])
    if not training or r == 0:
        return x, np.ones(x.shape, dtype=bool)
    if not 0 <= r < 1:
        raise ValueError(f"dropout ratio {r} is outside [0, 1)")
    keep = generator(seed).random(x.shape) >= r
    y = np.where(keep, x.astype(np.float64) / (1.0 - r), 0.0)
    return y.astype(x.dtype), keep
