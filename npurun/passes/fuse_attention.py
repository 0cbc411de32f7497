"""Attention from its decomposed form: the products, scalings and softmax an exporter writes for
scaled-dot-product attention become one `attention` node (ir/ops/sequence_models.py, ONNX's
Attention with 4-D operands), which reads the keys and values where they are:

    kr = reshape(expand(unsqueeze(k, [2]), ..), ..)     (grouped-query heads repeated; optional)
    s  = matmul(q * c1, transpose(kr * c2, [0, 1, 3, 2])) * c3      (each scaling optional)
    p  = masked_softmax(s, mask, nan_fix=1, nan_value=0)   or softmax(s)
    y  = matmul(p, vr)                                  ->  y = attention(q, k, v, mask, scale=c1*c2*c3)

Why: unfused, every step materializes the repeated keys and values (Hq / Hkv copies of the
cache), the scaled and transposed keys, and the padded scores; a decoder that keeps its
cache in place (kv_cache_in_place) would copy it again on every token. The attention kernel
multiplies each key/value head with its group of query heads straight from the cache view.

Exactness: the result is what the chain computed up to the order of the scalings (the
scales are multiplied once instead of applied to q and k apart: a few ulp). The softmax's
NaN fix (torch's exported SDPA writes where(isnan(p), 0, p)) is ONNX Attention's rule for a
row with no visible key, so a masked softmax fuses only with that fix (or with no mask at
all); a chain whose repeated heads or scalings are read elsewhere is left alone.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .match import Chains, in_regions


def fuse_attention(g: Graph) -> Graph:
    in_regions(fuse_attention, g)
    c = Chains(g)
    for pv in list(g.nodes):
        if pv.op != "matmul" or len(pv.inputs) != 2:
            continue
        found = _match(c, pv)
        if found is None:
            continue
        chain, (q, k, v, mask, scale) = found
        if not c.free(*chain) or any(_rank(g, x) != 4 for x in (q, k, v)):
            continue
        c.replace(chain, Node("attention", [q, k, v, mask or ""], list(pv.outputs), {"scale": scale},
                              name=pv.name))
    return c.commit()


def _rank(g: Graph, name: str):
    v = g.values.get(name)
    return None if v is None or v.shape is None else len(v.shape)


def _match(c: Chains, pv: Node):
    p, vr = pv.inputs
    sm = c.producer.get(p)
    if sm is None or c.sole(p) is not pv:
        return None
    a = OPS[sm.op].attrs_of(sm)
    if sm.op == "softmax" and a["axis"] == -1:
        scores, mask = sm.inputs[0], None
    elif sm.op == "masked_softmax" and a["axis"] == -1 and (len(sm.inputs) == 1 or not sm.inputs[1]):
        scores, mask = sm.inputs[0], None
    elif sm.op == "masked_softmax" and a["axis"] == -1 and a["nan_fix"] == 1 and a["nan_value"] == 0.0:
        x, m = sm.inputs  # the add was commutative: the scores are the one a matmul makes
        scores, mask = (x, m) if _product(c, x) else (m, x)
    else:
        return None
    if c.sole(scores) is not sm:
        return None
    chain = [sm, pv]
    s, f3 = _peel(c, scores, chain)
    qk = c.producer.get(s)
    if qk is None or qk.op != "matmul" or c.sole(s) is None:
        return None
    chain.append(qk)
    q, f1 = _peel(c, qk.inputs[0], chain)
    kr, f2 = _keys(c, qk.inputs[1], chain)
    if kr is None:
        return None
    kn, vn = [], []
    k, v = _unrepeat(c, kr, kn), _unrepeat(c, vr, vn)
    if bool(kn) != bool(vn):  # one side's repeat is read elsewhere: both stay repeated
        k, v, kn, vn = kr, vr, [], []
    return chain + kn + vn, (q, k, v, mask, f1 * f2 * f3)


def _product(c: Chains, name: str) -> bool:
    """Is `name` a matmul's result (through scalar scalings)?"""
    n = c.producer.get(name)
    while n is not None and _factor(c, n) is not None:
        n = c.producer.get(_scaled(c, n))
    return n is not None and n.op == "matmul"


def _scaled(c: Chains, n: Node) -> str:
    """The operand a scalar mul/div scales."""
    if n.op == "div":
        return n.inputs[0]
    return n.inputs[1] if c.scalar(n.inputs[0]) is not None else n.inputs[0]


def _factor(c: Chains, n: Node):
    """The factor a mul by a scalar constant (either operand) or a div by one applies, else
    None (a product of two tensors, a scalar divided by a tensor)."""
    if len(n.inputs) != 2:
        return None
    a, b = (c.scalar(i) for i in n.inputs)
    if n.op == "mul" and (a is None) != (b is None):
        return a if a is not None else b
    if n.op == "div" and a is None and b not in (None, 0.0):
        return 1.0 / b
    return None


def _peel(c: Chains, name: str, chain: list):
    """(the value under scalar mul/div nodes only the chain reads, their product)."""
    f = 1.0
    n = c.producer.get(name)
    while n is not None and c.sole(name) is not None:
        k = _factor(c, n)
        if k is None:
            break
        chain.append(n)
        f *= k
        name = _scaled(c, n)
        n = c.producer.get(name)
    return name, f


def _keys(c: Chains, name: str, chain: list):
    """The keys under transpose(.., [0, 1, 3, 2]) with scalings on either side of it."""
    name, f = _peel(c, name, chain)
    t = c.producer.get(name)
    if t is None or t.op != "transpose" or c.sole(name) is None \
            or list(OPS["transpose"].attrs_of(t)["perm"] or []) != [0, 1, 3, 2]:
        return None, f
    chain.append(t)
    k, f2 = _peel(c, t.inputs[0], chain)
    return k, f * f2


def _unrepeat(c: Chains, name: str, chain: list) -> str:
    """k for kr = reshape(expand(unsqueeze(k, [2]), ..), ..) (repeat_kv: each of k's heads
    repeated for its group of query heads, the (Hkv, group) axes merged), else `name`."""
    r = c.producer.get(name)
    if r is None or r.op != "reshape" or c.sole(name) is None:
        return name
    e = c.producer.get(r.inputs[0])
    if e is None or e.op != "expand" or c.sole(r.inputs[0]) is not r:
        return name
    u = c.producer.get(e.inputs[0])
    if u is None or u.op != "unsqueeze" or c.sole(e.inputs[0]) is not e or len(u.inputs) < 2:
        return name
    axes = c.const(u.inputs[1])
    k = u.inputs[0]
    ks, out = c.g.values[k].shape, c.g.values[name].shape
    if axes is None or [int(x) for x in axes.reshape(-1)] != [2] or ks is None or out is None \
            or len(ks) != 4 or len(out) != 4:
        return name
    for i in (0, 3):  # batch and head size carried over (where both are known)
        if isinstance(ks[i], int) and isinstance(out[i], int) and ks[i] != out[i]:
            return name
    if isinstance(ks[1], int) and isinstance(out[1], int) and out[1] % ks[1]:
        return name
    chain += [r, e, u]
    return k
