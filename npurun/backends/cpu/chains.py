"""Elementwise chains of a compiled cpu Program, rewritten into fewer steps (one pass over
memory instead of one NumPy pass and one fresh array per node). Run by fuse.py around the
conv epilogue fusion, on the Program's steps (never on the graph, which other backends share):

1. `hard_swish`: x * clip(x + 3, 0, 6) / 6 in any of its spellings (add -> clip -> mul -> div,
   add -> clip -> div -> mul, x * hard_sigmoid(x) with alpha 1/6), 4 nodes -> one hard_swish
   step, which the epilogue fusion then puts into a conv reading nothing else (PP-OCR, MobileNetV3).
2. `fold_into_conv`: conv -> (mul / add / sub / div by a constant scalar or per-channel
   (M, 1, 1) constant)* or conv -> batch_normalization, folded into the conv's weights and bias
   once at compile time (y = s * conv(x) + t = conv'(x) with W' = s W, b' = s b + t):
   PP-LCNetV3's "learnable affine" after each conv, a BN the exporter left unfolded.
3. `affine_runs`: whatever is left of s1 * act(s0 * x + t0) + t1 with constant scalars (at
   least two nodes, act optional: PP-LCNetV3's affine after conv+hard_swish) -> one step of
   `npr_affine_act` (csrc/chain.c), written over its input when that input is a conv's fresh
   result read by nothing else.

A chain fuses only where its intermediate values have no other reader (not a graph output, not
captured by a region) and every node in it computes in f32 (precision None or f32: a reduced-
precision node rounds where the graph says, see fuse.py). A fused step that gets an input its C
kernel does not take (not float32) runs the original steps one after another.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ...ir.graph import Node
from ...ir.ops import OPS
from . import native

AFFINE = {"add", "sub", "mul", "div"}
# Activations the C kernel applies between the two affines (codes of csrc/act.h).
CHAIN_ACTS = ("relu", "sigmoid", "tanh", "hard_swish", "hard_sigmoid", "leaky_relu")

if native.LIB is not None and hasattr(native.LIB, "npr_affine_act"):
    _F = ctypes.c_float
    native.LIB.npr_affine_act.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, _F, _F,
                                          ctypes.c_int, _F, _F, _F, _F]
    native.LIB.npr_affine_act.restype = None
    AFFINE_ACT = native.LIB.npr_affine_act
else:
    AFFINE_ACT = None


class _View:
    """Who produces and who reads each value, over the Program's current steps."""

    def __init__(self, prog):
        g = prog.graph
        self.prog, self.graph = prog, g
        self.outputs = set(g.outputs)
        self.captured = {c for n in g.nodes for r in n.regions.values() for c in r.captures()}
        self.readers: dict[str, list[int]] = {}
        self.producer: dict[str, int] = {}
        for k, (n, *_rest) in enumerate(prog.steps):
            for i in n.inputs:
                if i:
                    self.readers.setdefault(i, []).append(k)
            for o in n.outputs:
                self.producer[o] = k

    def node(self, k) -> Node:
        return self.prog.steps[k][0]

    def sole(self, v: str) -> int | None:
        """The one step reading `v` (once), if nothing else can see it."""
        rs = self.readers.get(v, [])
        if len(rs) != 1 or v in self.outputs or v in self.captured:
            return None
        return rs[0]

    def const(self, name: str):
        v = self.graph.values.get(name) if name else None
        if v is None or not v.is_const or v.data is None or v.data.dtype != np.float32:
            return None
        return v.data

    def scalar(self, name: str) -> float | None:
        d = self.const(name)
        return float(d.reshape(-1)[0]) if d is not None and d.size == 1 and d.ndim <= 4 else None


def _f32(n: Node) -> bool:
    return n.precision in (None, "f32")


def _affine_of(view: _View, k: int, v: str, channels: int | None = None):
    """The step k as y = a * v + c, a and c scalars (channels None) or per-channel (M,) arrays
    for a 4-D value of `channels` channels; None if it is not such a step."""
    n = view.node(k)
    if n.op not in AFFINE or len(n.inputs) != 2 or not _f32(n) or len(n.outputs) != 1:
        return None
    a, b = n.inputs
    if (a == v) == (b == v):
        return None
    other = b if a == v else a
    d = view.const(other)
    if d is None:
        return None
    if d.size == 1 and d.ndim <= 4:
        c = float(d.reshape(-1)[0])
    elif channels is not None and d.shape in ((channels, 1, 1), (1, channels, 1, 1)):
        c = d.reshape(-1).astype(np.float64)
    else:
        return None
    if n.op == "add":
        return 1.0, c
    if n.op == "mul":
        return c, 0.0
    if n.op == "sub":
        return (1.0, -c) if a == v else None  # c - v is not handled: rare
    if a == v and np.all(np.asarray(c) != 0):  # div v / c
        return 1.0 / np.asarray(c, np.float64) if channels else 1.0 / c, 0.0
    return None


def _replace(prog, ks: list[int], step, fused: dict) -> None:
    """Steps ks (a chain; ks[0] first) become `step` at ks[0]; the others are emptied (None)."""
    inner = {o for k in ks for o in prog.steps[k][0].outputs} - set(step[0].outputs)
    dead = [d for k in ks for d in prog.steps[k][3] if d not in inner]
    step = (step[0], step[1], step[2], list(dict.fromkeys(step[3] + dead)))
    for k in ks:
        fused[id(prog.steps[k][0])] = step[0]
    for k in ks[1:]:
        prog.steps[k] = None
    prog.steps[ks[0]] = step


# ---------------------------------------------------------------- 1. hard_swish

def hard_swish(prog, fused: dict) -> None:
    view = _View(prog)
    hs = prog.kernels.get("hard_swish")
    if hs is None:
        return
    for u, rs in list(view.readers.items()):
        if len(set(rs)) != 2 or len(rs) != 2 or u in view.outputs or u in view.captured \
                or any(prog.steps[k] is None for k in rs):
            continue
        chain = _match_hard_swish(view, u, rs)
        if chain is None:
            continue
        out = view.node(chain[-1]).outputs[0]
        node = Node("hard_swish", [u], [out], {}, {}, view.node(chain[-1]).name, None)
        _replace(prog, sorted(chain), (node, hs, {}, []), fused)


def _match_hard_swish(view: _View, u: str, rs: list[int]) -> list[int] | None:
    """Step indices of x * clip(x + 3, 0, 6) / 6 or x * hard_sigmoid(x) over x = u, last = out."""
    nodes = {k: view.node(k) for k in rs}
    if not all(_f32(n) for n in nodes.values()):
        return None

    def one(k, op):
        n = view.node(k)
        return n if n.op == op and _f32(n) else None

    def times_u(k, v):  # step k is mul(u, v) or mul(v, u)
        n = view.node(k)
        return n.op == "mul" and _f32(n) and sorted(n.inputs) == sorted([u, v])

    def over6(k, v):  # step k is v / 6 or v * (1/6)
        n = view.node(k)
        if not _f32(n) or len(n.inputs) != 2:
            return False
        if n.op == "div" and n.inputs[0] == v:
            return view.scalar(n.inputs[1]) == 6.0
        if n.op == "mul" and v in n.inputs:
            s = view.scalar(n.inputs[1] if n.inputs[0] == v else n.inputs[0])
            return s is not None and abs(s - 1 / 6) < 1e-7
        return False

    for k0, n0 in nodes.items():
        k1 = next(k for k in rs if k != k0)
        if n0.op == "hard_sigmoid":
            at = OPS["hard_sigmoid"].attrs_of(n0)
            if abs(at["alpha"] - 1 / 6) < 1e-7 and at["beta"] == 0.5 and times_u(k1, n0.outputs[0]) \
                    and view.sole(n0.outputs[0]) == k1:
                return [k0, k1]
            continue
        if n0.op != "add" or _affine_of(view, k0, u) != (1.0, 3.0):
            continue
        kc = view.sole(n0.outputs[0])
        c = one(kc, "clip") if kc is not None else None
        if c is None or len(c.inputs) != 3 or c.inputs[0] != n0.outputs[0] \
                or view.scalar(c.inputs[1]) != 0.0 or view.scalar(c.inputs[2]) != 6.0:
            continue
        k2 = view.sole(c.outputs[0])
        if k2 is None:
            continue
        if k2 == k1 and times_u(k1, c.outputs[0]):  # (u * clip) / 6
            k3 = view.sole(view.node(k1).outputs[0])
            if k3 is not None and over6(k3, view.node(k1).outputs[0]):
                return [k0, kc, k1, k3]
        elif over6(k2, c.outputs[0]):  # u * (clip / 6)
            d = view.node(k2).outputs[0]
            if view.sole(d) == k1 and times_u(k1, d):
                return [k0, kc, k2, k1]
    return None


# ---------------------------------------------------------------- 2. fold into conv

def fold_into_conv(prog, fused: dict) -> None:
    view = _View(prog)
    for k, st in enumerate(prog.steps):
        if st is None:
            continue
        n, fn, attrs, dead = st
        if n.op != "conv" or not _f32(n) or len(n.outputs) != 1 or len(n.inputs) < 2:
            continue
        w = view.const(n.inputs[1])
        b = view.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        if w is None or w.ndim != 4 or (len(n.inputs) > 2 and n.inputs[2] and b is None):
            continue
        m = w.shape[0]
        s, t = np.ones(m), np.zeros(m)
        chain, v = [k], n.outputs[0]
        while (r := view.sole(v)) is not None and prog.steps[r] is not None:
            rn = view.node(r)
            if rn.op == "batch_normalization" and rn.inputs[0] == v and _f32(rn) and len(rn.outputs) == 1:
                ps = [view.const(i) for i in rn.inputs[1:5]]
                if any(p is None or p.size != m for p in ps):
                    break
                g_, be, mu, var = (p.reshape(-1).astype(np.float64) for p in ps)
                a = g_ / np.sqrt(var + OPS["batch_normalization"].attrs_of(rn)["epsilon"])
                c = be - mu * a
            else:
                ac = _affine_of(view, r, v, m)
                if ac is None:
                    break
                a, c = ac
            s, t = a * s, a * t + c
            chain.append(r)
            v = rn.outputs[0]
        if len(chain) == 1:
            continue
        wf = (w.astype(np.float64) * s[:, None, None, None]).astype(np.float32)
        bf = ((0.0 if b is None else b.astype(np.float64)) * s + t).astype(np.float32)

        def folded(x, _w, _b=None, *, _fn=fn, _wf=wf, _bf=bf, **kw):
            return _fn(x, _wf, _bf, **kw)
        node = Node("conv", list(n.inputs), [v], n.attrs, n.hints, n.name, n.precision)
        _replace(prog, chain, (node, folded, attrs, []), fused)


# ---------------------------------------------------------------- 3. affine runs

def affine_runs(prog, fused: dict) -> None:
    if AFFINE_ACT is None:
        return
    view = _View(prog)
    for k, st in enumerate(prog.steps):
        if st is None or id(st[0]) in fused:
            continue
        n = st[0]
        if n.op in CHAIN_ACTS and len(n.inputs) == 1 and n.inputs[0]:
            x = n.inputs[0]  # act(x) followed by affines
        elif n.op in AFFINE and len(n.inputs) == 2:
            x = next((i for i in n.inputs if view.const(i) is None), None)
            if x is None or _affine_of(view, k, x) is None:
                continue
        else:
            continue
        p = view.producer.get(x)  # steps run in order: k is the head of its run
        chain, v = [], x
        s0, t0, act, s1, t1 = 1.0, 0.0, None, 1.0, 0.0
        r = k
        while True:
            if prog.steps[r] is None or id(prog.steps[r][0]) in fused:
                break
            rn = view.node(r)
            ac = _affine_of(view, r, v)
            if ac is not None:
                a, c = ac
                if act is None:
                    s0, t0 = a * s0, a * t0 + c
                else:
                    s1, t1 = a * s1, a * t1 + c
            elif act is None and rn.op in CHAIN_ACTS and rn.inputs == [v] and _f32(rn):
                act = rn
            else:
                break
            chain.append(r)
            v = rn.outputs[0]
            nxt = view.sole(v)
            if nxt is None:
                break
            r = nxt
        if len(chain) < 2:
            continue
        code, alpha, beta = native.act_params(act.op, OPS[act.op].attrs_of(act)) if act is not None else (0, 0.0, 0.0)
        in_place = view.sole(x) == k and p is not None and prog.steps[p] is not None and view.node(p).op == "conv"
        subs = [prog.steps[j] for j in chain]
        fn = _affine_kernel(subs, (s0, t0, code, alpha, beta, s1, t1), in_place, prog.consts)
        node = Node("chain", [x], [v], {}, {}, "+".join(view.node(j).op for j in chain), None)
        _replace(prog, chain, (node, fn, {}, []), fused)


def _affine_kernel(subs, params, in_place: bool, consts: dict):
    """y = s1 * act(s0 * x + t0) + t1 in one pass; other dtypes run the original steps."""
    s0, t0, code, alpha, beta, s1, t1 = (float(p) if i != 2 else int(p) for i, p in enumerate(params))
    head = next(i for i in subs[0][0].inputs if i and i not in consts)

    def run(x):
        if x.dtype != np.float32:
            env = {**consts, head: x}
            for n, fn, attrs, _ in subs:
                args = [env[i] if i else None for i in n.inputs]
                env[n.outputs[0]] = fn(*args, **attrs)
            return env[subs[-1][0].outputs[0]]
        x = np.ascontiguousarray(x)
        y = x if in_place and x.flags.writeable else np.empty_like(x)
        AFFINE_ACT(native.ptr(x), native.ptr(y), x.size, s0, t0, code, alpha, beta, s1, t1)
        return y
    return run


def compact(prog) -> None:
    prog.steps = [s for s in prog.steps if s is not None]
