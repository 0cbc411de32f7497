"""Are the calibration builders the graphs the exporters make? npusim's estimate of a model as
PyTorch exports it beside its builder in npurun/zoo/architectures, op counts and per-op-type
times side by side (x-elite-hexagon, the shipped calibration).

    .venv/bin/python -m pip install mobilesam-mirror==1.0.0   # once
    .venv/bin/python bench/npusim_builder_check.py [--only mobilesam_decoder,...]

Exports (torch.onnx, random weights, into a temporary folder): MobileSAM's image encoder, and
its decoder with AI Hub's changes for QNN written out here (every attention split into one
chain per head, linear layers as 1x1 convs: qai_hub_models/models/_shared/sam/model_patches.py);
DETR-ResNet-50 is transformers' DetrForObjectDetection as bench/corpus.py builds it (320x320,
its own ResNet backbone), against the builder at that size; its random initialisation leaves
every frozen BatchNorm's shift at zero, which the standard passes drop as a no-op: 53 adds fewer
than a trained checkpoint's export, which the builder writes.

2026-12-05 (the 89-row calibration): builder/export 1.010 (MobileSAM encoder, 300 / 305 timed
ops), 0.980 (decoder, 564 / 581), 1.133 (DETR-R50 at 320x320, the 53 adds).
"""
from __future__ import annotations

import argparse
import collections
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

from npurun.backends.npusim.model import choose_precision, node_timings, resolve_shapes  # noqa: E402
from npurun.backends.npusim.placement import place  # noqa: E402
from npurun.backends.npusim.view import npusim_view  # noqa: E402
from npurun.devices import load_device  # noqa: E402
from npurun.frontend import load  # noqa: E402
from npurun.zoo.architectures import build, transformer  # noqa: E402


class _Conv1x1(torch.nn.Module):
    """A linear layer (or some of its output rows) as a 1x1 conv over (..., T, d) tokens."""

    def __init__(self, lin, rows=slice(None)):
        super().__init__()
        w, b = lin.weight[rows], lin.bias[rows]
        self.conv = torch.nn.Conv2d(w.shape[1], w.shape[0], 1)
        self.conv.weight.data.copy_(w[:, :, None, None])
        self.conv.bias.data.copy_(b)

    def forward(self, x):
        nd = x.ndim
        x = x.unsqueeze(0).unsqueeze(1) if nd == 2 else x.unsqueeze(1)
        x = self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x.squeeze(1).squeeze(0) if nd == 2 else x.squeeze(1)


class _SplitHeads(torch.nn.Module):
    def __init__(self, att):
        super().__init__()
        self.h, self.d = att.num_heads, att.internal_dim // att.num_heads
        per_head = lambda lin: torch.nn.ModuleList(  # noqa: E731
            _Conv1x1(lin, slice(i * self.d, (i + 1) * self.d)) for i in range(self.h))
        self.q, self.k, self.v, self.out = per_head(att.q_proj), per_head(att.k_proj), per_head(att.v_proj), att.out_proj

    def forward(self, q, k, v):
        heads = []
        for i in range(self.h):
            a = torch.softmax(self.q[i](q) @ self.k[i](k).transpose(-2, -1) / math.sqrt(self.d), dim=-1)
            heads.append(a @ self.v[i](v))
        return self.out(torch.cat(heads, -1))


class _Mlp(torch.nn.Module):
    def __init__(self, layers, act=torch.relu):
        super().__init__()
        self.layers, self.act = torch.nn.ModuleList(_Conv1x1(x) for x in layers), act

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else self.act(layer(x))
        return x


class _Call(torch.nn.Module):
    """fn(*args) as a module that owns `model` (the tracer takes its parameters as weights)."""

    def __init__(self, fn, model):
        super().__init__()
        self.fn, self.model = fn, model

    def forward(self, *args):
        return self.fn(*args)


def _mobilesam_exports(folder: Path) -> dict:
    from npusim_reference_macs import _mobile_sam
    sam = _mobile_sam()  # (first: it stands in for what mobile_sam's imports pull in)
    from mobile_sam.utils.onnx import SamOnnxModel
    md, t = sam.mask_decoder, sam.mask_decoder.transformer
    t.final_attn_token_to_image = _SplitHeads(t.final_attn_token_to_image)
    for blk in t.layers:
        blk.self_attn = _SplitHeads(blk.self_attn)
        blk.cross_attn_token_to_image = _SplitHeads(blk.cross_attn_token_to_image)
        blk.cross_attn_image_to_token = _SplitHeads(blk.cross_attn_image_to_token)
        blk.mlp = _Mlp([blk.mlp.lin1, blk.mlp.lin2], blk.mlp.act)
    for i, m in enumerate(md.output_hypernetworks_mlps):
        md.output_hypernetworks_mlps[i] = _Mlp(m.layers)
    md.iou_prediction_head = _Mlp(md.iou_prediction_head.layers)
    onnx_model = SamOnnxModel(sam, return_single_mask=True)
    pe = sam.prompt_encoder

    def decoder(emb, coords, labels):
        dense = torch.zeros(1, 1, 64, 64) + pe.no_mask_embed.weight.reshape(1, -1, 1, 1)
        masks, scores = md.predict_masks(emb, pe.get_dense_pe(), onnx_model._embed_points(coords, labels), dense)
        return onnx_model.select_masks(masks, scores, coords.shape[1])

    def encoder(x):
        return sam.image_encoder((x - sam.pixel_mean / 255) / (sam.pixel_std / 255))

    out = {}
    for name, fn, args in (("mobilesam_encoder", encoder, (torch.rand(1, 3, 1024, 1024),)),
                           ("mobilesam_decoder", decoder, (torch.randn(1, 256, 64, 64), torch.rand(1, 2, 2) * 1000,
                                                           torch.tensor([[1.0, 0.0]])))):
        module = _Call(fn, sam)
        path = folder / f"{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(module, args, str(path), opset_version=17, dynamo=False)
        out[name] = (load(path), build(name))
    return out


def _detr() -> dict:
    import corpus
    return {"detr_resnet50 (320x320)": (load(corpus.path("detr_r50")), transformer.detr(50, h=320, w=320))}


def timed(g, dev, prec="fp16"):
    g = npusim_view(g)
    shapes = resolve_shapes(g, {})
    precs = [choose_precision(n, g, prec) for n in g.nodes]
    placement, _ = place(g, shapes, precs, dev.sram.size_bytes)
    per_op: dict = collections.defaultdict(lambda: [0, 0.0])
    for n, t in zip(g.nodes, node_timings(g, dev, shapes, placement, prec, dev.dvfs[-1].freq_mhz * 1e6)):
        if t.unit:
            per_op[n.op][0] += 1
            per_op[n.op][1] += t.time_s
    return per_op


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated: mobilesam_encoder, mobilesam_decoder, detr")
    a = ap.parse_args(argv)
    dev = load_device("x-elite-hexagon")
    pairs = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not a.only or "mobilesam" in a.only:
            pairs.update(_mobilesam_exports(Path(tmp)))
        if not a.only or "detr" in a.only:
            pairs.update(_detr())
        for name, (exported, built) in pairs.items():
            if a.only and not any(k in name for k in a.only.split(",")):
                continue
            e, b = timed(exported, dev), timed(built, dev)
            te, tb = (sum(t for _, t in x.values()) for x in (e, b))
            ne, nb = (sum(n for n, _ in x.values()) for x in (e, b))
            print(f"{name}: export {1e3 * te:.2f} ms ({ne} timed ops), builder {1e3 * tb:.2f} ms ({nb}), "
                  f"builder/export {tb / te:.3f}")
            for op in sorted(set(e) | set(b), key=lambda o: -max(e.get(o, [0, 0])[1], b.get(o, [0, 0])[1]))[:10]:
                (n1, t1), (n2, t2) = e.get(op, [0, 0.0]), b.get(op, [0, 0.0])
                print(f"    {op:24s} export {n1:4d} ops {1e3 * t1:7.2f} ms   builder {n2:4d} ops {1e3 * t2:7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
