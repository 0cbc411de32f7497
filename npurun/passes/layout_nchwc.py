"""NCHWc activations: chains of convolutions run on activations blocked by channel,
(N, C, H, W) -> (N, C/c, H, W, c), the layout in which a vector of c output channels is one
register (c = 4 for 128-bit, 8 for AVX2 f32, 16 for AVX-512).

Which nodes run blocked, in one walk in topological order:
  * a conv with group 1, 4-D, whose input and output channel counts are multiples of c
    (becomes `conv_nchwc`);
  * a unary elementwise node (an activation) whose input is already blocked — it does not
    care about the layout, so it stays inside the chain instead of closing it.
Conversions are then the fewest this assignment allows: one `layout_pack` per plain value
that a blocked node reads (shared by all its blocked readers), one `layout_unpack` per
blocked value that a plain node or a graph output reads (shared likewise). ESPCN:

    conv(1->64) tanh | pack | conv_nchwc(64->32) tanh | unpack | conv(32->9) depth_to_space

A blocked value lives in its plain value's memory space. Graph inputs and outputs keep
their names and plain layout. Off by default: the cpu backend's compiled kernels take NCHW
only (docs/passes.md has the measurements).
"""
from __future__ import annotations

import functools

from ..ir.graph import Graph, Node
from ..ir.ops import OPS
from .rewrite import drop_unused_values, new_value


def _blockable_conv(g: Graph, n: Node, c: int) -> bool:
    a = OPS["conv"].attrs_of(n) if n.op == "conv" else {}
    if n.op != "conv" or n.regions or a["group"] != 1 or a["activation"]:  # (conv_nchwc has no epilogue)
        return False
    x, w = g.values[n.inputs[0]], g.values[n.inputs[1]]
    m, ci = w.shape[0], w.shape[1]
    return len(x.shape) == 4 and isinstance(m, int) and isinstance(ci, int) and m % c == 0 and ci % c == 0 \
        and w.kind == "tensor"


def _blocked_shape(shape, c):
    n, ch, h, w = shape
    return (n, ch // c, h, w, c)


def layout_nchwc(g: Graph, block: int = 4) -> Graph:
    c = block
    blocked: dict[str, str] = {}   # plain value -> its blocked twin (produced by a blocked node)
    packs: dict[str, str] = {}     # plain value -> packed copy made by a layout_pack
    unpacked: dict[str, str] = {}  # blocked twin -> plain value it was unpacked to
    out: list[Node] = []

    def blocked_in(name: str) -> str:
        if name in blocked:
            return blocked[name]
        if name not in packs:
            v = g.values[name]
            packs[name] = new_value(g, f"{name}.nchwc", _blocked_shape(v.shape, c), v.dtype, v.space)
            out.append(Node("layout_pack", [name], [packs[name]], {"layout": "nchwc", "block": c}))
        return packs[name]

    def plain_in(name: str) -> str:
        """A plain node reads `name`: unpack it if only its blocked twin exists."""
        if name in blocked and name not in unpacked:
            unpacked[name] = name
            v = g.values[name]
            out.append(Node("layout_unpack", [blocked[name]], [name],
                            {"layout": "nchwc", "block": c, "size": v.shape[1]}))
        return name

    for n in g.nodes:
        ins = n.inputs
        unary = "unary" in OPS[n.op].groups and "elementwise" in OPS[n.op].groups
        if _blockable_conv(g, n, c) or (unary and ins[0] in blocked and not n.regions
                                        and n.op not in ("cast", "bitcast")):
            y = g.values[n.outputs[0]]
            twin = new_value(g, f"{y.name}.nchwc", _blocked_shape(y.shape, c), y.dtype, y.space)
            if n.op == "conv":
                node = Node("conv_nchwc", [blocked_in(ins[0])] + list(ins[1:]), [twin],
                            {**n.attrs, "block": c}, dict(n.hints), n.name, n.precision)
            else:
                node = Node(n.op, [blocked[ins[0]]], [twin], dict(n.attrs), dict(n.hints), n.name, n.precision)
            out.append(node)
            blocked[y.name] = twin
            continue
        n.inputs = [plain_in(i) if i else i for i in ins]
        for r in n.regions.values():
            for cap in r.captures():
                plain_in(cap)
        out.append(n)
    for o in g.outputs:
        plain_in(o)
    # An unpack was appended when first needed: after its blocked producer, before its reader.
    g.nodes = out
    drop_unused_values(g)
    return g


def nchwc(block: int) -> "functools.partial":
    """The pass with a block size, for a pipeline list: `nchwc(8)`."""
    return functools.partial(layout_nchwc, block=block)
