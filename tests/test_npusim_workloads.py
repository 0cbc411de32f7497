"""npusim for transformer-era workloads: weight-only precisions, the exporter's shape arithmetic,
attention, and the LLM / Whisper / Stable Diffusion pipelines of `npurun estimate`."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from npurun.backends.npusim.data import AIHUB_LLM, data_path
from npurun.backends.npusim.pipelines import run_pipeline
from npurun.backends.npusim.simulate import estimate
from npurun.devices import load_device
from npurun.zoo.architectures import build
from npurun.zoo.architectures.builder import Builder


def _mlp(lazy=False):
    b = Builder("mlp", seed=1, lazy=lazy)
    x = b.input("x", (1, 8, 256))
    return b.output(b.linear(b.node("gelu", [b.linear(x, 1024)]), 256))


def test_weight_only_precisions_store_weights_narrower():
    g = _mlp()
    dev = load_device("x-elite-hexagon")
    r8, r4 = (estimate(g, "edge-npu-1t", precision=p) for p in ("w8a16", "w4a16"))
    assert r4.dram_bytes + r4.sram_bytes < r8.dram_bytes + r8.sram_bytes
    w = 2 * 256 * 1024  # the two weight matrices
    assert (r8.dram_bytes + r8.sram_bytes) - (r4.dram_bytes + r4.sram_bytes) == pytest.approx(w * (1 - 0.5 - 2 / 64), abs=8)
    a16 = estimate(g, dev, precision="w8a16")
    assert a16.main_precision == "w8a16" and a16.latency_s > 0


def test_lazy_weights_are_random_views_of_the_declared_shape():
    g = _mlp(lazy=True)
    w = [v for v in g.values.values() if v.is_const and v.data.ndim == 2]
    assert w and all(v.data.shape == v.shape and not v.data.flags.writeable for v in w)
    assert all(np.count_nonzero(v.data[0]) == v.shape[1] for v in w)


def test_shape_arithmetic_costs_nothing():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write a flatten, costs what
    a reshape by a constant costs."""
    def graph(computed: bool):
        b = Builder("s")
        x = b.input("x", (1, 64, 8, 8))
        y = b.conv(x, 64, 3)
        if computed:
            n = b.node("gather", [b.node("shape", [y]), b.ints(0)], axis=0)
            shp = b.concat([b.node("unsqueeze", [n, b.ints([0])]), b.ints([-1])], axis=0)
        else:
            shp = b.ints([1, -1])
        return b.output(b.node("reshape", [y, shp]))
    a, c = (estimate(graph(k), "x-elite-hexagon", precision="fp16") for k in (True, False))
    assert a.latency_s == pytest.approx(c.latency_s, rel=1e-12)


@pytest.mark.parametrize("act,fused", [("relu", True), ("prelu", True), ("swish", False)])
def test_piecewise_linear_activations_fuse_into_the_conv(act, fused):
    b = Builder("f")
    y = b.conv(b.input("x", (1, 32, 16, 16)), 32, 3)
    extra = [b.floats(np.full((32, 1, 1), 0.25))] if act == "prelu" else []
    g = b.output(b.node(act, [y, *extra]))
    rep = estimate(g, "x-elite-hexagon", precision="int8")
    a = next(n for n in rep.nodes if n.op == act)
    assert (a.time_s == 0 and a.fused == ["(fused)"]) if fused else a.time_s > 0


def test_attention_scores_stay_on_chip():
    """SD's 64x64 self-attention: 8 x 4096 x 4096 scores (268 MB at fp16) never reach DRAM."""
    b = Builder("att")
    x = b.input("x", (1, 4096, 320))
    from npurun.zoo.architectures.transformer import self_attention
    g = b.output(self_attention(b, x, 8))
    rep = estimate(g, "x-elite-hexagon", precision="fp16")
    soft = next(n for n in rep.nodes if n.op == "softmax")
    assert soft.dram_bytes == 0 and soft.sram_bytes == 2 * 2 * 8 * 4096 * 4096


def test_llm_decode_is_bandwidth_bound_and_prompt_compute_bound():
    dev = load_device("x-elite-hexagon")
    tok = estimate(build("qwen2_5_1_5b_instruct_token"), dev, precision="w4a16")
    prompt = estimate(build("qwen2_5_1_5b_instruct_prompt"), dev, precision="w4a16")
    assert tok.bound_time("memory") > tok.bound_time("compute")
    assert prompt.bound_time("compute") > prompt.bound_time("memory")
    # decode reads every weight once: at least the 4-bit weight bytes of the model
    assert tok.dram_bytes + tok.sram_bytes > 1.3e9 * 0.5


def test_every_llm_of_the_table_estimates_tokens_per_s_and_ttft(tmp_path, capsys):
    from npurun.cli import main
    with data_path(AIHUB_LLM).open(newline="") as f:
        names = sorted({r["model"] for r in csv.DictReader(f)})
    assert len(names) == 24
    seen = {}
    for name in names:
        out = tmp_path / f"{name}.json"
        assert main(["estimate", name, "--device", "x-elite-hexagon", "--precision", "w4a16", "--json", str(out)]) == 0
        d = json.loads(out.read_text())
        assert d["tokens_per_s"] > 0 and d["ttft_ms"] > 0 and d["latency_ms"] > 0 and d["pipeline"] == "llm"
        seen[name] = (d["tokens_per_s"], d["ttft_ms"])
    # a bigger model decodes slower; the _quantized names are the same models
    assert seen["qwen2_5_1_5b_instruct"][0] > seen["llama_v3_8b_chat"][0]
    assert seen["llama_v3_8b_chat_quantized"] == seen["llama_v3_8b_chat"]
    assert "tokens_per_s" in capsys.readouterr().out


def test_whisper_and_sd_pipelines():
    dev = load_device("x-elite-hexagon")
    w = run_pipeline("whisper_tiny", dev)
    enc, dec = w.parts[0][2].latency_s, w.parts[1][2].latency_s
    assert w.figures["seconds_per_30s_audio"] == pytest.approx(enc + 200 * dec)
    assert w.figures["times_real_time"] == pytest.approx(30 / (enc + 200 * dec))
    sd = run_pipeline("stable_diffusion_v1_5", dev, steps=10)
    parts = {c: (k, r) for c, k, r in sd.parts}
    assert parts["unet"][0] == 20 and parts["text encoder"][0] == 2
    total = sum(k * r.latency_s for k, r in parts.values())
    assert sd.figures["seconds_per_image"] == pytest.approx(total)
    assert sd.figures["images_per_j"] == pytest.approx(1 / sum(k * r.energy_j for k, r in parts.values()))
    d = sd.to_dict()
    assert d["pipeline"] == "sd" and d["components"]["unet"]["runs"] == 20 and d["assumptions"]
