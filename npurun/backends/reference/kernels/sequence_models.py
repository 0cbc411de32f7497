"""Reference kernels: attention in its forms, rotary embeddings, RMS normalization, linear
attention, stateful causal convolution, KV-cache scatter, and the RNN/GRU/LSTM cells.

They compute in float64 and cast back to the operand type at the end, so fp16/bf16 models get
the exact result rounded once rather than an error accumulated step by step. Attention is the
exception: ONNX defines it by a function body that rounds to the operand type at fixed steps,
so for fp16/bf16 operands it computes in that type, step by step (see `attention`).
"""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import to_numpy
from . import _like, kernel


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


# ---------------------------------------------------------------------------------- attention

def _to_heads(x, heads):
    """(B, S, H*D) -> (B, H, S, D); a 4-D tensor is already split into heads."""
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _from_heads(y):
    """(B, H, S, D) -> (B, S, H*D)."""
    b, h, s, d = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def _attention_allowed(batch, sq, total, offset, nonpad, is_causal, left, right):
    """Which keys each query may see, from causality, padding and the sliding window, as a
    (B, 1, Sq, T) boolean. Query i sits at absolute position p = offset[b] + i."""
    p = offset.reshape(batch, 1, 1, 1) + np.arange(sq).reshape(1, 1, sq, 1)
    j = np.arange(total).reshape(1, 1, 1, total)
    allowed = np.ones((batch, 1, sq, total), dtype=bool)
    if is_causal:
        allowed &= j <= p
    if nonpad is not None:
        allowed &= j < nonpad.reshape(batch, 1, 1, 1)
    if left >= 0:
        allowed &= j >= p - left
    if right >= 0:
        allowed &= j <= p + right
    return allowed


def _mask_bias(attn_mask, total, ct=np.float64):
    """The attn_mask as an additive bias in type `ct`: False -> -inf, a float mask as is; a
    mask shorter than the T keys is padded with -inf (those keys are not attended)."""
    if attn_mask.dtype == np.bool_:
        bias = np.where(attn_mask, 0.0, -np.inf).astype(ct)
    else:
        bias = attn_mask.astype(ct)
    short = total - bias.shape[-1]
    if short > 0:
        bias = np.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, short)], constant_values=-np.inf)
    return bias


def _safe_softmax(s):
    """Softmax over the last axis where a row with no attended key (all -inf) is all zeros
    rather than NaN, as ONNX Attention specifies."""
    m = s.max(axis=-1, keepdims=True)
    zero, one = np.zeros((), s.dtype), np.ones((), s.dtype)
    e = np.exp(s - np.where(m > -np.inf, m, zero))  # a dead row stays exp(-inf) = 0
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > zero, total, one)


def _matmul(a, b):
    """a @ b in the operands' type (NumPy gives bfloat16 products as float32)."""
    return np.matmul(a, b).astype(a.dtype, copy=False)


@kernel("attention")
def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal, q_num_heads, kv_num_heads, qk_matmul_output_mode, scale, softcap,
              softmax_precision, left_window_size, right_window_size):
    # f32/f64: scores and softmax run in float64 (which meets any softmax_precision) and round
    # once. f16/bf16: the ONNX function body's rounding, step by step in the operand type T:
    # sqrt(scale) in T scales q and k, the scores round to T, the bias adds in T, the softmax
    # runs in softmax_precision (T if none), its result rounds to T before the last matmul.
    low = q.dtype.itemsize < 4
    ct = q.dtype if low else np.dtype(np.float64)
    three_d = q.ndim == 3
    qh, kh, vh = _to_heads(q, q_num_heads), _to_heads(k, kv_num_heads), _to_heads(v, kv_num_heads)
    # The cache grows by concatenation along the sequence axis: keys are (B, Hkv, P + S, D).
    if past_key is not None:
        kh = np.concatenate([past_key, kh], axis=2)
        vh = np.concatenate([past_value, vh], axis=2)
    present_k, present_v = kh, vh
    batch, hq, sq, d = qh.shape
    total = kh.shape[2]
    # Grouped-query attention: query head h reads key/value head h // (Hq / Hkv).
    group = hq // kh.shape[1]
    kx, vx = np.repeat(kh.astype(ct), group, axis=1), np.repeat(vh.astype(ct), group, axis=1)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    if low:
        root = ct.type(np.sqrt(scale))
        qk = _matmul(qh * root, kx.transpose(0, 1, 3, 2) * root)
    else:
        qk = (_f64(qh) @ kx.transpose(0, 1, 3, 2)) * scale
    capped = (np.tanh(qk / ct.type(softcap)) * ct.type(softcap)) if softcap else qk
    # Causal and window bounds count from the keys before the query block: the past cache,
    # or (external cache) the non-padded keys beyond the queries.
    if past_key is not None:
        offset = np.full(batch, past_key.shape[2])
    elif nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen.astype(np.int64) - sq
    else:
        offset = np.zeros(batch, np.int64)
    allowed = _attention_allowed(batch, sq, total, offset, nonpad_kv_seqlen, is_causal,
                                 left_window_size, right_window_size)
    biased = np.where(allowed, capped, ct.type(-np.inf))
    if attn_mask is not None:
        biased = biased + _mask_bias(attn_mask, total, ct)
    if low:
        sp = to_numpy(softmax_precision) if softmax_precision else ct
        probs = _safe_softmax(biased.astype(sp)).astype(ct)
        y = _matmul(probs, vx)
    else:
        probs = _safe_softmax(biased)
        y = probs @ vx
    y = _from_heads(y) if three_d else y
    qk_out = (qk, capped, biased, probs)[qk_matmul_output_mode]
    return (y.astype(q.dtype), present_k, present_v, qk_out.astype(q.dtype))


@kernel("rotary_embedding")
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, num_heads,
                     rotary_embedding_dim):
    # Work on (B, S, H, D): a 4-D input is (B, H, S, D), a 3-D one (B, S, H*D).
    xs = x.transpose(0, 2, 1, 3) if x.ndim == 4 else x.reshape(*x.shape[:2], num_heads, -1)
    xs = _f64(xs)
    dim = rotary_embedding_dim or xs.shape[-1]
    if position_ids is not None:  # caches are (max_pos, dim/2), indexed per token
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    cos, sin = _f64(cos_cache)[:, :, None, :], _f64(sin_cache)[:, :, None, :]  # (B, S, 1, dim/2)
    rot = xs[..., :dim]
    # Pairs to rotate: (even, odd) lanes when interleaved, else the two halves.
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    rot = np.stack([real, imag], axis=-1).reshape(rot.shape) if interleaved \
        else np.concatenate([real, imag], axis=-1)
    out = np.concatenate([rot, xs[..., dim:]], axis=-1)
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return _like(x, out)


@kernel("rms_normalization")
def rms_normalization(x, scale, *, axis, epsilon, stash_type):
    # Stage one (the RMS) runs in stash_type precision; the scale multiplies in x's type.
    xs = x.astype(to_numpy(stash_type))
    axes = tuple(range(axis % x.ndim, x.ndim))
    rms = np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + epsilon)
    return _like(x, (xs / rms).astype(x.dtype) * scale)


# ---------------------------------------------------------------------- linear attention

@kernel("linear_attention")
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, q_num_heads,
                     kv_num_heads, scale, update_rule, chunk_size):
    # Heads unpacked: q (B, T, Hq, dk), k (B, T, Hkv, dk), v (B, T, Hkv, dv); the state per
    # key/value head is a (dk, dv) matrix S, and each step reads o = scale * q^T S.
    b, t, _ = query.shape
    q = _f64(query).reshape(b, t, q_num_heads, -1)
    k = _f64(key).reshape(b, t, kv_num_heads, -1)
    v = _f64(value).reshape(b, t, kv_num_heads, -1)
    dk, dv = k.shape[-1], v.shape[-1]
    scale = scale or 1.0 / np.sqrt(q.shape[-1])
    state = np.zeros((b, kv_num_heads, dk, dv)) if past_state is None else _f64(past_state)
    # decay is (B, T, Hkv*dk) per key dim or (B, T, Hkv) per head: as (B, T, Hkv, dk or 1).
    gate = None if decay is None else np.exp(_f64(decay).reshape(b, t, kv_num_heads, -1))
    rate = None if beta is None else np.broadcast_to(_f64(beta), (b, t, kv_num_heads))
    group = q_num_heads // kv_num_heads
    out = np.empty((b, t, q_num_heads, dv))
    for i in range(t):
        ki, vi = k[:, i], v[:, i]  # (B, Hkv, dk), (B, Hkv, dv)
        if update_rule in ("gated", "gated_delta"):
            state = gate[:, i, :, :, None] * state  # decays the rows of S (one per key dim)
        if update_rule in ("delta", "gated_delta"):
            # Move S's prediction for k, S^T k, toward v at rate beta.
            err = vi - np.einsum("bhkv,bhk->bhv", state, ki)
            vi = rate[:, i, :, None] * err
        state = state + ki[..., :, None] * vi[..., None, :]
        heads = np.repeat(state, group, axis=1)  # query head h reads state h // group
        out[:, i] = scale * np.einsum("bhk,bhkv->bhv", q[:, i], heads)
    present_dtype = query.dtype if past_state is None else past_state.dtype
    return out.reshape(b, t, -1).astype(query.dtype), state.astype(present_dtype)


# ---------------------------------------------------------------- causal convolution, cache

@kernel("causal_conv_with_state")
def causal_conv_with_state(x, w, b=None, past_state=None, *, activation):
    # x is (B, C, L), w is (C, 1, K): each channel sees its K-1 previous values (the carried
    # state, or zeros) followed by the input, and y[t] = sum_j w[j] * padded[t + j].
    n, c, length = x.shape
    k = w.shape[2]
    past = np.zeros((n, c, k - 1)) if past_state is None else _f64(past_state)
    padded = np.concatenate([past, _f64(x)], axis=2)
    y = sum(_f64(w[:, 0, j]).reshape(1, c, 1) * padded[:, :, j:j + length] for j in range(k))
    if b is not None:
        y = y + _f64(b).reshape(1, c, 1)
    if activation in ("silu", "swish"):
        y = y / (1.0 + np.exp(-y))
    present = padded[:, :, padded.shape[2] - (k - 1):]
    return y.astype(x.dtype), present.astype(x.dtype)


@kernel("tensor_scatter")
def tensor_scatter(past_cache, update, write_indices=None, *, axis, mode):
    # Each batch row b writes its S updates at cache positions write_indices[b] + s on `axis`
    # (wrapping around the cache length in circular mode).
    axis = axis % past_cache.ndim
    out = past_cache.copy()
    size, steps = past_cache.shape[axis], update.shape[axis]
    starts = np.zeros(past_cache.shape[0], np.int64) if write_indices is None else write_indices
    for b in range(past_cache.shape[0]):
        pos = int(starts[b]) + np.arange(steps)
        if mode == "circular":
            pos = pos % size
        dst = np.moveaxis(out[b], axis - 1, 0)  # a view: writing it writes `out`
        dst[pos] = np.moveaxis(update[b], axis - 1, 0)
    return out


# --------------------------------------------------------------------------- recurrent cells

def _activation(name, alpha, beta):
    """One ONNX recurrent activation by name, with its alpha/beta where it takes them."""
    name = name.lower()
    fns = {
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "tanh": np.tanh,
        "relu": lambda x: np.maximum(x, 0.0),
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0.0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0.0, 1.0),
        "elu": lambda x: np.where(x >= 0, x, alpha * (np.exp(x) - 1.0)),
        "softsign": lambda x: x / (1.0 + np.abs(x)),
        "softplus": lambda x: np.log1p(np.exp(x)),
    }
    if name not in fns:
        raise ValueError(f"unknown recurrent activation {name!r}")
    return fns[name]


# Default alpha/beta of the activations that take them (ONNX operator definitions).
_ALPHA = {"leakyrelu": 0.01, "thresholdedrelu": 1.0, "scaledtanh": 1.0, "hardsigmoid": 0.2,
          "elu": 1.0, "affine": 1.0}
_BETA = {"scaledtanh": 1.0, "hardsigmoid": 0.5, "affine": 0.0}


def _activations(names, alphas, betas, defaults, dirs, plain=None):
    """Per direction, the list of activation functions. activation_alpha/beta list values only
    for the activations that take them, in order. `plain` maps lower-case names of activations
    without parameters to other implementations (the cpu backend's faster sigmoid)."""
    names = list(names or defaults * dirs)
    alphas, betas = list(alphas or []), list(betas or [])
    fns = []
    for nm in names:
        key = nm.lower()
        a = alphas.pop(0) if key in _ALPHA and alphas else _ALPHA.get(key)
        b = betas.pop(0) if key in _BETA and betas else _BETA.get(key)
        fns.append((plain or {}).get(key) or _activation(nm, a, b))
    per = len(fns) // dirs
    return [fns[i * per:(i + 1) * per] for i in range(dirs)]


def _recurrence(x, w, b, sequence_lens, initial_states, hidden, *, direction, layout, step):
    """Run `step` over the sequence in each direction.

    x is (S, B, I) (or (B, S, I) with layout=1); w (D, G*H, I); b (D, 2*G*H).
    `step(d, gx, states) -> states` takes direction d's input projection x_t W^T + Wb + Rb
    (B, G*H) and its states (each (B, H); states[0] is h). Past a batch row's sequence length
    its outputs are zero and its states are held. Returns y and the final states in the
    requested layout: y (S, D, B, H) or (B, S, D, H), states (D, B, H) or (B, D, H).
    """
    x = _f64(x)
    if layout:
        x = x.transpose(1, 0, 2)
    seq, batch, _ = x.shape
    dirs, gh = w.shape[0], w.shape[1]
    lens = np.full(batch, seq) if sequence_lens is None else sequence_lens.astype(np.int64)
    bias = np.zeros((dirs, 2 * gh)) if b is None else _f64(b)
    y = np.zeros((seq, dirs, batch, hidden))
    finals = []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        states = [np.zeros((batch, hidden)) if s is None else np.array(s[d], np.float64)
                  for s in initial_states]  # copies: the loop updates them in place
        proj = x @ _f64(w[d]).T + bias[d, :gh] + bias[d, gh:]  # (S, B, G*H)
        for t in range(seq):
            rows = np.nonzero(lens > t)[0]  # rows still inside their sequence
            # Reversed, row b walks its own valid steps from lens[b]-1 down to 0.
            ts = lens[rows] - 1 - t if reverse else np.full(len(rows), t)
            new = step(d, proj[ts, rows], [s[rows] for s in states])
            for s, n in zip(states, new):
                s[rows] = n
            y[ts, d, rows] = states[0][rows]
        finals.append(states)
    finals = [np.stack([f[i] for f in finals]) for i in range(len(initial_states))]
    if layout:
        return y.transpose(2, 0, 1, 3), [f.transpose(1, 0, 2) for f in finals]
    return y, finals


def _clipper(clip):
    return (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)


def _dbh(state, layout):
    """An initial state as (D, B, H); layout=1 gives it as (B, D, H)."""
    return state.transpose(1, 0, 2) if state is not None and layout else state


@kernel("rnn")
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size, direction,
        activations, activation_alpha, activation_beta, clip, layout):
    # h_t = f(x_t W^T + h_{t-1} R^T + Wb + Rb)
    dirs = w.shape[0]
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], dirs)
    cl, rr = _clipper(clip), _f64(r)

    def step(d, gx, states):
        return [acts[d][0](cl(gx + states[0] @ rr[d].T))]
    y, (h,) = _recurrence(x, w, b, sequence_lens, [_dbh(initial_h, layout)], r.shape[2], direction=direction,
                          layout=layout, step=step)
    return y.astype(x.dtype), h.astype(x.dtype)


@kernel("gru")
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size, direction,
        activations, activation_alpha, activation_beta, clip, layout, linear_before_reset):
    # Gates in ONNX order z (update), r (reset), h (candidate); f = sigmoid, g = tanh by default.
    dirs, hid = w.shape[0], r.shape[2]
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], dirs)
    cl, rr = _clipper(clip), _f64(r)
    rb = np.zeros((dirs, 3 * hid)) if b is None else _f64(b)[:, 3 * hid:]

    def step(d, gx, states):
        f, g = acts[d]
        h = states[0]
        rz, rr_, rh = np.split(rr[d], 3)
        # gx holds x W^T + Wb + Rb; the candidate's Rbh must sit inside the reset product
        # when linear_before_reset, so take it out of gx and put it back where it belongs.
        gz, gr, gh = np.split(gx, 3, axis=1)
        z = f(cl(gz + h @ rz.T))
        reset = f(cl(gr + h @ rr_.T))
        rbh = rb[d, 2 * hid:]
        if linear_before_reset:
            cand = g(cl(gh - rbh + reset * (h @ rh.T + rbh)))
        else:
            cand = g(cl(gh + (reset * h) @ rh.T))
        return [(1.0 - z) * cand + z * h]
    y, (h,) = _recurrence(x, w, b, sequence_lens, [_dbh(initial_h, layout)], hid, direction=direction,
                          layout=layout, step=step)
    return y.astype(x.dtype), h.astype(x.dtype)


@kernel("lstm")
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         hidden_size, direction, activations, activation_alpha, activation_beta, clip, layout,
         input_forget):
    # Gates in ONNX order i (input), o (output), f (forget), c (cell); peepholes p are
    # (D, 3H) in order i, o, f. f = sigmoid, g = h = tanh by default.
    dirs, hid = w.shape[0], r.shape[2]
    acts = _activations(activations, activation_alpha, activation_beta,
                        ["Sigmoid", "Tanh", "Tanh"], dirs)
    cl, rr = _clipper(clip), _f64(r)
    peep = np.zeros((dirs, 3 * hid)) if p is None else _f64(p)

    def step(d, gx, states):
        f, g, hact = acts[d]
        h, c = states
        pi, po, pf = np.split(peep[d], 3)
        gi, go, gf, gc = np.split(gx + h @ rr[d].T, 4, axis=1)
        i = f(cl(gi + pi * c))
        # input_forget couples the gates: what is not let in is kept.
        fg = 1.0 - i if input_forget else f(cl(gf + pf * c))
        c = fg * c + i * g(cl(gc))
        o = f(cl(go + po * c))
        return [o * hact(c), c]
    states = [_dbh(initial_h, layout), _dbh(initial_c, layout)]
    y, (h, c) = _recurrence(x, w, b, sequence_lens, states, hid, direction=direction,
                            layout=layout, step=step)
    return y.astype(x.dtype), h.astype(x.dtype), c.astype(x.dtype)


@kernel("flex_attention")
def flex_attention(q, k, v, *, scale, softmax_precision, _regions):
    # Scores and probabilities are (B, Hq, L, S) in softmax_precision, the type the score_mod
    # and prob_mod regions see; query head h reads key/value head h // (Hq / Hkv).
    group = q.shape[1] // k.shape[1]
    kx, vx = np.repeat(_f64(k), group, axis=1), np.repeat(_f64(v), group, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    work = to_numpy(softmax_precision)
    scores = ((_f64(q) @ kx.transpose(0, 1, 3, 2)) * scale).astype(work)
    scores = _f64(_regions["score_mod"]([scores])[0])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = (e / e.sum(axis=-1, keepdims=True)).astype(work)
    probs = _f64(_regions["prob_mod"]([probs])[0])
    return (probs @ vx).astype(q.dtype)
