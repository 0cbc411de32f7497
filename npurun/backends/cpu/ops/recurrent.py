"""LSTM, GRU and RNN as whole kernels: one BLAS matmul for the input projection of every time
step (x (S*B, I) @ W^T, both biases added once), then the recurrence, one (B, H) @ (H, G*H)
matmul and a few vector operations per step, all in the operand's dtype (float32 or float64).

The reference kernels (reference/kernels/sequence_models.py) compute in float64 through a
generic per-step `step` callback with per-gate splits and row masks for sequence lengths; for
silero-vad's one-step LSTM (B = 1, H = 128) that is ~250 us a call, this ~25 us. Covered:
every direction (forward, reverse, bidirectional), both layouts, clip, peepholes,
input_forget, GRU's linear_before_reset, every activation the reference knows (sigmoid and
tanh computed without overflow: sigmoid(x) = 0.5 tanh(x/2) + 0.5). The float32 LSTM with the
default activations (and an even hidden size) runs its recurrence in csrc/recurrent.c, one
call per direction (silero's step: ~24 -> ~12 us a call, timed alone), the two directions of a
bidirectional one at once on two threads (npr_recurrent2_mt: each streams its own weights). Not covered, so run by
the reference kernel: sequence_lens that differ from the sequence length (rows that stop
early), dtypes other than float32/float64.
"""
from __future__ import annotations

import functools

import numpy as np

from ... import pieces
from ...reference.kernels import KERNELS as REF
from ...reference.kernels.sequence_models import _activations
from .. import native
from . import matmul as MM


def _sigmoid(v):
    return 0.5 * np.tanh(0.5 * v) + 0.5


def _acts(names, alphas, betas, defaults, dirs):
    """Per direction, the activation functions, parsed as the reference does, with NumPy's
    tanh and a sigmoid without overflow."""
    return _activations(names, alphas, betas, defaults, dirs, {"sigmoid": _sigmoid, "tanh": np.tanh})


def _covered(x, w, r, sequence_lens, layout) -> bool:
    if x.dtype not in (np.float32, np.float64) or w.dtype != x.dtype or r.dtype != x.dtype:
        return False
    if sequence_lens is not None:
        seq = x.shape[1 if layout else 0]
        return bool(np.all(np.asarray(sequence_lens) == seq))
    return True


def _run(x, w, inits, hidden, direction, layout, gates_bias, cell):
    """Drive `cell(d, gx_t, states) -> states` over time for each direction.

    x (S, B, I) or (B, S, I) with layout = 1; w (D, G*H, I); `gates_bias(d)` the (G*H,) bias
    folded into the input projection; inits: initial states (D, B, H) (or (B, D, H)) or None.
    Returns y (S, D, B, H) or (B, S, D, H) and the final states (D, B, H) or (B, D, H)."""
    dt = x.dtype
    if layout:
        x = x.transpose(1, 0, 2)
        inits = [None if s is None else s.transpose(1, 0, 2) for s in inits]
    seq, batch, size = x.shape
    dirs = w.shape[0]
    flat = np.ascontiguousarray(x).reshape(seq * batch, size)
    y = np.empty((seq, dirs, batch, hidden), dt)
    finals = [np.empty((dirs, batch, hidden), dt) for _ in inits]
    for d in range(dirs):
        proj = flat @ w[d].T  # (S*B, G*H): every step's input projection in one matmul
        bias = gates_bias(d)
        if bias is not None:
            proj += bias
        proj = proj.reshape(seq, batch, -1)
        states = [np.zeros((batch, hidden), dt) if s is None else np.array(s[d], dt) for s in inits]
        steps = range(seq - 1, -1, -1) if (direction == "reverse" or d == 1) else range(seq)
        for t in steps:
            states = cell(d, proj[t], states)
            y[t, d] = states[0]
        for f, s in zip(finals, states):
            f[d] = s
    if layout:
        return y.transpose(2, 0, 1, 3), [f.transpose(1, 0, 2) for f in finals]
    return y, finals


def _lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
          hidden_size, direction, activations, activation_alpha, activation_beta, clip, layout, input_forget,
          threads=1):
    if not _covered(x, w, r, sequence_lens, layout):
        return REF["lstm"](x, w, r, b, sequence_lens, initial_h, initial_c, p, hidden_size=hidden_size,
                           direction=direction, activations=activations, activation_alpha=activation_alpha,
                           activation_beta=activation_beta, clip=clip, layout=layout, input_forget=input_forget)
    dirs, hid = w.shape[0], r.shape[2]
    dt = x.dtype
    if (_LIB is not None and dt == np.float32 and hid % 2 == 0 and not clip and p is None and not input_forget
            and (not activations or [a.lower() for a in activations] == ["sigmoid", "tanh", "tanh"] * dirs)):
        return _lstm_native(x, w, r, b, initial_h, initial_c, hid, direction, layout, threads)
    acts = _acts(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], dirs)
    rt = [r[d].T for d in range(dirs)]  # (H, 4H) views: BLAS reads the transpose in place
    peep = None if p is None else np.asarray(p, dt)
    plain = [a[0] is _sigmoid and not clip and peep is None and not input_forget for a in acts]

    def bias(d):
        return None if b is None else (b[d, :4 * hid] + b[d, 4 * hid:]).astype(dt, copy=False)

    def cell(d, gx, states):
        h, c = states
        g = gx + h @ rt[d]  # (B, 4H): gates i, o, f, c
        f, ga, ha = acts[d]
        if plain[d]:  # the common case: i, o, f in one sigmoid call
            s = f(g[:, :3 * hid])
            i, o, fg = s[:, :hid], s[:, hid:2 * hid], s[:, 2 * hid:]
            c = fg * c + i * ga(g[:, 3 * hid:])
            return [o * ha(c), c]
        cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
        gi, go, gf, gc = g[:, :hid], g[:, hid:2 * hid], g[:, 2 * hid:3 * hid], g[:, 3 * hid:]
        pi, po, pf = (0, 0, 0) if peep is None else (peep[d, :hid], peep[d, hid:2 * hid], peep[d, 2 * hid:])
        i = f(cl(gi + pi * c))
        fg = 1.0 - i if input_forget else f(cl(gf + pf * c))
        c = fg * c + i * ga(cl(gc))
        o = f(cl(go + po * c))
        return [o * ha(c), c]
    y, (h, c) = _run(x, w, [initial_h, initial_c], hid, direction, layout, bias, cell)
    return y.astype(dt, copy=False), h.astype(dt, copy=False), c.astype(dt, copy=False)


# Pieces (backends/pieces.py, issue L): on a contended device a long recurrence runs as ranges
# of time steps with a preemption point between them; the state is carried in h (and c), so the
# ranges compute what one call does. A step's recurrent product is B x H x G multiply-adds,
# usually bound by streaming R from L3 (rated at a tenth of a conv's FLOP/s; learned per op).
STEP_FLOPS = 3e9
_LSTM_CAL: dict = {}
_GRU_CAL: dict = {}


def _steps(seq: int, macs_per_step: int, cal: dict):
    """[0, seq) whole, or in pieces of time steps (backends/pieces.py)."""
    return pieces.each(pieces.cut(seq, 2.0 * macs_per_step * seq / STEP_FLOPS, cal=cal))


def _lstm_native(x, w, r, b, initial_h, initial_c, hid, direction, layout, threads=1):
    """The default-activation float32 LSTM: the input projection by BLAS, the recurrence in
    csrc/recurrent.c (one call per direction)."""
    if layout:
        x = x.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    seq, batch, size = x.shape
    dirs = w.shape[0]
    flat = np.ascontiguousarray(x).reshape(seq * batch, size)
    y = np.empty((seq, dirs, batch, hid), np.float32)
    hs, cs = _state(initial_h, (dirs, batch, hid)), _state(initial_c, (dirs, batch, hid))
    rts = _panels(r)
    projs = []
    for d in range(dirs):  # (S*B, 4H), every step's input projection in one product
        projs.append(_project(flat, w, d, None if b is None else b[d, :4 * hid] + b[d, 4 * hid:], threads))
    ys, p = dirs * batch * hid, native.ptr
    rc = 0
    for s0, s1 in _steps(seq, dirs * batch * 4 * hid * hid, _LSTM_CAL):
        if dirs == 2 and threads > 1:  # the two directions at once, one per thread
            rc = rc or _LIB.npr_recurrent2_mt(0, p(projs[0]), p(projs[1]), p(rts[0]), p(rts[1]), None, None, p(hs[0]),
                                              p(hs[1]), p(cs[0]), p(cs[1]), p(y[0, 0]), p(y[0, 1]), ys, seq, batch,
                                              hid, 0, threads, s0, s1)
        else:
            for d, proj in enumerate(projs):
                rc = rc or _LIB.npr_lstm_f32(p(proj), p(rts[d]), p(hs[d]), p(cs[d]), p(y[0, d]), ys, seq, batch, hid,
                                             int(direction == "reverse" or d == 1), s0, s1)
    if rc:
        raise MemoryError("the LSTM kernel could not allocate its gate buffer")
    if layout:
        return y.transpose(2, 0, 1, 3), hs.transpose(1, 0, 2), cs.transpose(1, 0, 2)
    return y, hs, cs


_RT: dict = {}  # id(W) -> (W, [W[d]^T contiguous])
_ZERO = np.zeros(1, np.float32)


class _Threads:  # (what matmul.linear reads of a program)
    def __init__(self, threads):
        self.threads = threads


def _project(flat, w, d, bias, threads):
    """flat @ w[d]^T (+ bias), float32 and contiguous: the packed sgemm on w[d]^T packed once,
    on the program's threads, the bias in its epilogue; NumPy's BLAS for other dtypes. (NumPy's
    BLAS is held to one thread inside a run: ddddocr's two (20 x 512) @ (512 x 2048) projections
    took 2 ms of a 4 ms LSTM at 2 threads that way.) Under PACKED_MIN_MACS products stay on
    NumPy's BLAS as before, no gain having been measured there (silero-vad's one-step 128-wide
    projection: A/B runs swung 0.81-1.23 either way), except in a recorded program
    (native.CALLS), whose replay needs C calls."""
    if w.dtype == np.float32 and (native.CALLS.cheap or flat.shape[0] * w.shape[1] * w.shape[2] >= PACKED_MIN_MACS):
        wt = _transposed(w)[d]
        packs = _derived(_PACKS, wt, lambda wt: {})
        y = MM.linear(_Threads(threads), flat, wt, packs, () if bias is None else (bias.astype(np.float32),))
        if y is not None:
            return y
    proj = flat @ w[d].T
    if bias is not None:
        proj += bias
    return np.ascontiguousarray(proj, np.float32)


_PACKS: dict = {}  # id(w[d]^T) -> (it, its packed copy's cache: matmul.linear's)
PACKED_MIN_MACS = 1 << 20  # an input projection this big goes to the packed sgemm on the program's threads


def _state(initial, shape):
    """The recurrence's state, which the kernels update in place: a copy of `initial`, or zeros;
    in a replayed program by a recorded copy (the zeros too: the recorded buffer holds the last
    run's final state)."""
    if native.CALLS.cheap and (initial is None or initial.dtype == np.float32):
        st = np.empty(shape, np.float32)
        if native.copy_into(st, _ZERO if initial is None else initial):
            return st
    return np.zeros(shape, np.float32) if initial is None else np.array(initial, np.float32, order="C")


def _derived(table: dict, arr, make):
    """make(arr), kept in `table` under id(arr) while arr is alive (the constants are the same
    arrays every run); at most 16 per table, the oldest let go first."""
    hit = table.get(id(arr))
    if hit is None or hit[0] is not arr:
        if len(table) >= 16:
            table.pop(next(iter(table)))
        hit = table[id(arr)] = (arr, make(arr))
    return hit[1]


def _transposed(w):
    """W[d]^T contiguous, per direction."""
    return _derived(_RT, w, lambda w: [np.ascontiguousarray(w[d].T, np.float32) for d in range(w.shape[0])])


def _panels(r):
    """R (dirs, G, H) as the C recurrences read it: per direction R^T in panels of 8 columns,
    (G / 8, H, 8), so a step's h @ R^T streams each panel front to back (csrc/recurrent.c
    vecmat)."""
    g, h = r.shape[1], r.shape[2]
    return _derived(_PANELS, r, lambda r: [np.ascontiguousarray(r[d].reshape(g // 8, 8, h).transpose(0, 2, 1),
                                                                np.float32) for d in range(r.shape[0])])


_PANELS: dict = {}  # id(R) -> (R, its panels per direction)
_LIB = native.LIB  # (signatures: native.py)


def _gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size, direction, activations,
         activation_alpha, activation_beta, clip, layout, linear_before_reset, threads=1):
    if not _covered(x, w, r, sequence_lens, layout):
        return REF["gru"](x, w, r, b, sequence_lens, initial_h, hidden_size=hidden_size, direction=direction,
                          activations=activations, activation_alpha=activation_alpha,
                          activation_beta=activation_beta, clip=clip, layout=layout,
                          linear_before_reset=linear_before_reset)
    dirs, hid = w.shape[0], r.shape[2]
    dt = x.dtype
    if (_LIB is not None and dt == np.float32 and hid % 8 == 0 and not clip
            and (not activations or [a.lower() for a in activations] == ["sigmoid", "tanh"] * dirs)):
        return _gru_native(x, w, r, b, initial_h, hid, direction, layout, linear_before_reset, threads)
    acts = _acts(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], dirs)
    rzr = [r[d, :2 * hid].T for d in range(dirs)]  # (H, 2H): z, r (views)
    rh = [r[d, 2 * hid:].T for d in range(dirs)]  # (H, H): candidate
    rbh = [None if b is None else b[d, 5 * hid:].astype(dt, copy=False) for d in range(dirs)]
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)

    def bias(d):
        # z, r: Wb + Rb; the candidate: Wbh, plus Rbh unless it sits inside the reset product.
        if b is None:
            return None
        wb, rb = b[d, :3 * hid], b[d, 3 * hid:]
        out = wb + rb
        if linear_before_reset:
            out[2 * hid:] = wb[2 * hid:]
        return out.astype(dt, copy=False)

    def cell(d, gx, states):
        h = states[0]
        f, g = acts[d]
        zr = f(cl(gx[:, :2 * hid] + h @ rzr[d]))
        z, rst = zr[:, :hid], zr[:, hid:]
        if linear_before_reset:
            hr = h @ rh[d]
            if rbh[d] is not None:
                hr += rbh[d]
            cand = g(cl(gx[:, 2 * hid:] + rst * hr))
        else:
            cand = g(cl(gx[:, 2 * hid:] + (rst * h) @ rh[d]))
        return [cand + z * (h - cand)]  # (1 - z) * cand + z * h
    y, (h,) = _run(x, w, [initial_h], hid, direction, layout, bias, cell)
    return y.astype(dt, copy=False), h.astype(dt, copy=False)


def _gru_native(x, w, r, b, initial_h, hid, direction, layout, lbr, threads=1):
    """The default-activation float32 GRU: the input projection by BLAS, the recurrence in
    csrc/recurrent.c (one call per direction)."""
    if layout:
        x = x.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
    seq, batch, size = x.shape
    dirs = w.shape[0]
    flat = np.ascontiguousarray(x).reshape(seq * batch, size)
    y = np.empty((seq, dirs, batch, hid), np.float32)
    hs = _state(initial_h, (dirs, batch, hid))
    rts = _panels(r)
    projs, rbhs = [], []
    for d in range(dirs):
        rbh = bias = None
        if b is not None:
            wb, rb = b[d, :3 * hid], b[d, 3 * hid:]
            bias = wb + rb
            if lbr:  # the candidate's Rbh sits inside the reset product: the kernel adds it
                bias[2 * hid:] = wb[2 * hid:]
                rbh = np.ascontiguousarray(rb[2 * hid:], np.float32)
        projs.append(_project(flat, w, d, bias, threads))  # (S*B, 3H)
        rbhs.append(rbh)
    ys, p = dirs * batch * hid, native.ptr
    rc = 0
    for s0, s1 in _steps(seq, dirs * batch * 3 * hid * hid, _GRU_CAL):
        if dirs == 2 and threads > 1:  # the two directions at once, one per thread
            rc = rc or _LIB.npr_recurrent2_mt(1, p(projs[0]), p(projs[1]), p(rts[0]), p(rts[1]), p(rbhs[0]),
                                              p(rbhs[1]), p(hs[0]), p(hs[1]), None, None, p(y[0, 0]), p(y[0, 1]), ys,
                                              seq, batch, hid, int(bool(lbr)), threads, s0, s1)
        else:
            for d, proj in enumerate(projs):
                rc = rc or _LIB.npr_gru_f32(p(proj), p(rts[d]), p(rbhs[d]), p(hs[d]), p(y[0, d]), ys, seq, batch, hid,
                                            int(direction == "reverse" or d == 1), int(bool(lbr)), s0, s1)
    if rc:
        raise MemoryError("the GRU kernel could not allocate its gate buffer")
    if layout:
        return y.transpose(2, 0, 1, 3), hs.transpose(1, 0, 2)
    return y, hs


def _rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, hidden_size, direction, activations,
         activation_alpha, activation_beta, clip, layout):
    if not _covered(x, w, r, sequence_lens, layout):
        return REF["rnn"](x, w, r, b, sequence_lens, initial_h, hidden_size=hidden_size, direction=direction,
                          activations=activations, activation_alpha=activation_alpha,
                          activation_beta=activation_beta, clip=clip, layout=layout)
    dirs, hid = w.shape[0], r.shape[2]
    dt = x.dtype
    acts = _acts(activations, activation_alpha, activation_beta, ["Tanh"], dirs)
    rt = [r[d].T for d in range(dirs)]
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)

    def bias(d):
        return None if b is None else (b[d, :hid] + b[d, hid:]).astype(dt, copy=False)

    def cell(d, gx, states):
        return [acts[d][0](cl(gx + states[0] @ rt[d]))]
    y, (h,) = _run(x, w, [initial_h], hid, direction, layout, bias, cell)
    return y.astype(dt, copy=False), h.astype(dt, copy=False)


KERNELS = {"lstm": lambda program: functools.partial(_lstm, threads=program.threads),
           "gru": lambda program: functools.partial(_gru, threads=program.threads), "rnn": lambda program: _rnn}
