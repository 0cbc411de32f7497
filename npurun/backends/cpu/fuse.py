"""Epilogue fusion over a compiled Program's steps: an activation that reads only a conv's
result becomes part of that conv (applied in registers before the store), so the conv's
result never reaches memory. Patterns:

    u = conv(..); y = act(u)                 -> y = conv(.., _act=act)
    u = conv(..); s = sigmoid(u); y = u * s  -> y = conv(.., _act="silu")      (YOLOv8's SiLU)

A pattern fuses only where the intermediate values have no other reader and are not graph
outputs; the fused step takes the conv's place, which is safe because the activation reads
nothing but the conv's result (and constants). Readers are counted over the Program's steps,
so chains.py's rewrites (run before: hard-swish chains to one step, affines folded into convs;
after: the remaining affine/activation runs) compose with this fusion.
"""
from __future__ import annotations

from ...ir.graph import Node
from ...ir.ops import OPS
from . import chains, conv
from .native import ACTIVATIONS


def _epilogue_ok(act: Node, graph, native: bool) -> bool:
    if act.precision not in (None, "f32"):  # fusing would move where its rounding happens
        return False
    if not native:
        return act.op in conv.EPILOGUES
    if act.op not in ACTIVATIONS:
        return False
    if act.op == "clip":  # bounds must be constant scalars to become two numbers
        return all(not nm or (graph.values[nm].is_const and graph.values[nm].data.size == 1)
                   for nm in act.inputs[1:])
    return True


def fuse_epilogues(prog, native: bool) -> dict[int, Node]:
    """Rewrite prog.steps; return {id(node fused away): the step node that computes it now}."""
    fused: dict[int, Node] = {}
    chains.hard_swish(prog, fused)
    chains.compact(prog)
    chains.fold_into_conv(prog, fused)
    chains.compact(prog)
    fused.update(_epilogues(prog, native))
    if native:
        chains.affine_runs(prog, fused)
        chains.compact(prog)
    return fused


def _epilogues(prog, native: bool) -> dict[int, Node]:
    graph = prog.graph
    readers: dict[str, list[Node]] = {}
    for st in prog.steps:
        for i in st[0].inputs:
            if i:
                readers.setdefault(i, []).append(st[0])
    captured = {c for n in graph.nodes for r in n.regions.values() for c in r.captures()}
    outputs = set(graph.outputs) | captured
    index = {id(s[0]): k for k, s in enumerate(prog.steps)}
    fused: dict[int, Node] = {}
    drop: set[int] = set()
    new_steps = list(prog.steps)

    def only_readers(name, nodes) -> bool:
        return name not in outputs and {id(r) for r in readers.get(name, [])} == {id(n) for n in nodes} \
            and len(readers.get(name, [])) == len(nodes)

    for k, (n, fn, attrs, dead) in enumerate(prog.steps):
        if n.op != "conv" or not n.outputs or n.outputs[0] in outputs or n.precision not in (None, "f32"):
            continue  # (a reduced-precision conv rounds its own result: never fused)
        u = n.outputs[0]
        rs = readers.get(u, [])
        chain, act, act_attrs = None, None, None
        if len(rs) == 1 and rs[0].inputs[0] == u and u not in rs[0].inputs[1:] and _epilogue_ok(rs[0], graph, native):
            a = rs[0]
            chain, act, act_attrs = [a], a.op, OPS[a.op].attrs_of(a)
            if a.op == "clip":
                lo, hi = (list(a.inputs[1:]) + ["", ""])[:2]
                act_attrs = {"_min": float(graph.values[lo].data) if lo else None,
                             "_max": float(graph.values[hi].data) if hi else None}
        elif native and len(rs) == 2:
            sig = next((r for r in rs if r.op == "sigmoid" and r.inputs == [u]), None)
            mul = next((r for r in rs if r.op == "mul"), None)
            if sig is not None and mul is not None and {sig.precision, mul.precision} <= {None, "f32"} and sorted(mul.inputs) == sorted([u, sig.outputs[0]]) \
                    and only_readers(sig.outputs[0], [mul]):
                chain, act, act_attrs = [sig, mul], "silu", {}
        if chain is None or any(id(c) not in index for c in chain):
            continue
        last = chain[-1]
        inner = {u} | {c.outputs[0] for c in chain[:-1]}
        n2 = Node(n.op, n.inputs, last.outputs, n.attrs, n.hints, n.name, n.precision)
        extra = [d for c in chain for d in prog.steps[index[id(c)]][3] if d not in inner]
        new_steps[k] = (n2, fn, {**attrs, "_act": act, "_act_attrs": act_attrs},
                        [d for d in dead if d not in inner] + extra)
        for c in chain:
            fused[id(c)] = n
            drop.add(index[id(c)])
    prog.steps = [s for k, s in enumerate(new_steps) if k not in drop]
    return fused
