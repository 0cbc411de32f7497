"""Add + activation fusion: an activation that alone reads an add's result becomes one
`add_activation` node, computed in one pass over memory:

    y = relu(a + b)  ->  y = add_activation(a, b, activation="relu")

A residual block ends this way (ResNet, its TF exports, BiT: conv, add the shortcut, ReLU),
and the two passes over the block's output were 9-11% of those models' runs. Every
activation of ir/ops/elementwise.FUSABLE_ACTIVATIONS fuses (clip with constant bounds);
float32 adds of two computed values only (a constant's add is a bias, which the conv, the
linear layer or fuse_affine_chain takes). Run after fuse_activation and fuse_matmul_add.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from ..ir.ops.elementwise import FUSABLE_ACTIVATIONS
from .fuse_activation import _params
from .match import Chains, in_regions


def fuse_add_activation(g: Graph) -> Graph:
    in_regions(fuse_add_activation, g)
    c = Chains(g)
    for add in list(g.nodes):
        if add.op != "add" or len(add.inputs) != 2 or c.dtype(add.outputs[0]) != "f32" \
                or any(c.const(i) is not None for i in add.inputs):
            continue  # (an add of a constant is a bias: fold_affine's, fuse_matmul_add's, fuse_affine_chain's)
        act = c.sole(add.outputs[0])
        if act is None or act.op not in FUSABLE_ACTIVATIONS or act.inputs[0] != add.outputs[0] \
                or not c.free(add, act) or g.values[act.outputs[0]].shape != g.values[add.outputs[0]].shape:
            continue
        params = _params(c, act)
        if params is None:
            continue
        c.replace([add, act], Node("add_activation", list(add.inputs), list(act.outputs),
                                   {"activation": act.op, "activation_params": params},
                                   name=act.name or add.name, precision=add.precision))
    return c.commit()
