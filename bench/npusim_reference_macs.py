"""Reference MAC counts for the npusim calibration architectures whose AI Hub rows publish
none: counted by torch.utils.flop_counter on the reference PyTorch implementations
(transformers, diffusers) built from their published configurations on the meta device (no
weights, nothing downloaded), or from the configuration alone where a one-step decoder with
a KV cache is simpler to count than to build (Whisper's decoder, the LLMs). Writes
npurun/backends/npusim/data/reference_macs.csv; tests/test_npusim_architectures.py checks
every builder against it (within 1.5%).

    .venv/bin/python -m pip install diffusers mobilesam-mirror==1.0.0  # once; transformers comes with the test extra
    .venv/bin/python bench/npusim_reference_macs.py
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from npurun.backends.npusim.data import HERE, REFERENCE_MACS  # noqa: E402
from npurun.zoo.architectures import llm as L  # noqa: E402


def counted(fn) -> float:
    """GMACs of fn() (flop_counter counts 2 FLOPs per multiply-add of mm/bmm/conv/attention)."""
    with torch.device("meta"), FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops() / 2 / 1e9


def meta(cls, cfg):
    cfg._attn_implementation = "eager"  # sdpa's mask shortcuts read values, which meta tensors lack
    with torch.device("meta"):
        return cls(cfg).eval()


def bert(layers=12):
    from transformers import BertConfig, BertModel
    m = meta(BertModel, BertConfig(num_hidden_layers=layers))
    return counted(lambda: m(input_ids=torch.zeros(1, 384, dtype=torch.long)))  # no padding: same MACs


def clip_config():
    from transformers import CLIPConfig
    return CLIPConfig(text_config=dict(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                                       num_hidden_layers=12, max_position_embeddings=77),
                      vision_config=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                         num_hidden_layers=12, patch_size=16, image_size=224),
                      projection_dim=512)


def clip():
    from transformers import CLIPModel
    m = meta(CLIPModel, clip_config())
    return counted(lambda: m(input_ids=torch.zeros(1, 77, dtype=torch.long), pixel_values=torch.zeros(1, 3, 224, 224)))


def sd_text():
    from transformers import CLIPTextConfig, CLIPTextModel
    m = meta(CLIPTextModel, CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                           num_hidden_layers=12, max_position_embeddings=77))
    return counted(lambda: m(input_ids=torch.zeros(1, 77, dtype=torch.long)))


WHISPER = {"tiny": (384, 4, 6), "base": (512, 6, 8)}


def whisper_encoder(size):
    """The encoder plus every decoder layer's cross-attention K and V projections of its output
    (what AI Hub's HfWhisperEncoder returns)."""
    from transformers import WhisperConfig, WhisperModel
    d, layers, h = WHISPER[size]
    cfg = WhisperConfig(d_model=d, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=h,
                        decoder_attention_heads=h, encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d)
    m = meta(WhisperModel, cfg)

    def run():
        out = m.encoder(torch.zeros(1, 80, 3000)).last_hidden_state
        for layer in m.decoder.layers:
            layer.encoder_attn.k_proj(out), layer.encoder_attn.v_proj(out)
    return counted(run)


def whisper_decoder(size, cache=200, vocab=51865):
    """One step from the configuration: per layer the self-attention Q, K, V, O and the
    cross-attention Q, O projections, the MLP, attention over `cache` and 1500 positions; the
    logits."""
    d, layers, _ = WHISPER[size]
    per_layer = 6 * d * d + 8 * d * d + 2 * cache * d + 2 * 1500 * d
    return (layers * per_layer + d * vocab) / 1e9


def unet():
    from diffusers import UNet2DConditionModel
    with torch.device("meta"):
        m = UNet2DConditionModel(cross_attention_dim=768).eval()   # otherwise the defaults are SD 1.x's
    return counted(lambda: m(torch.zeros(1, 4, 64, 64), torch.tensor([10.0]), torch.zeros(1, 77, 768)))


def vae():
    from diffusers import AutoencoderKL
    blocks = 4
    with torch.device("meta"):
        m = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * blocks, up_block_types=("UpDecoderBlock2D",) * blocks,
                          block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4,
                          sample_size=512).eval()
    return counted(lambda: m.decode(torch.zeros(1, 4, 64, 64)))


def detr(depth):
    """transformers' DetrForObjectDetection with its own ResNet backbone (facebook/detr-resnet-*'s
    shapes) at AI Hub's 480x480. Counted on the CPU with random weights: DETR's mask handling
    reads tensor values (.item()), which the meta device has not."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig
    bc = ResNetConfig(depths={50: [3, 4, 6, 3], 101: [3, 4, 23, 3]}[depth], layer_type="bottleneck",
                      hidden_sizes=[256, 512, 1024, 2048], out_features=["stage4"])
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=bc, use_pretrained_backbone=False)
    cfg._attn_implementation = "eager"
    m = DetrForObjectDetection(cfg).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        m(pixel_values=torch.randn(1, 3, 480, 480), pixel_mask=torch.ones(1, 480, 480, dtype=torch.long))
    return fc.get_total_flops() / 2 / 1e9


def _mobile_sam():
    """mobile_sam (PyPI: mobilesam-mirror, the MobileSAM repository packaged) with stand-ins for
    what its imports pull in and counting never runs: its package imports the predictor and the
    mask generator (torchvision), TinyViT three helpers from timm (whose layers import
    torchvision too; no torchvision wheel matches this torch)."""
    import types

    def stub(name, **kw):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__dict__.update(kw)
            sys.modules[name] = m
    for name in ("torchvision", "timm"):
        try:
            __import__(name)
        except ImportError:
            stub(name)
    stub("timm.models")
    stub("timm.models.registry", register_model=lambda f: f)
    stub("timm.models.layers", DropPath=torch.nn.Identity, trunc_normal_=torch.nn.init.trunc_normal_,
         to_2tuple=lambda x: tuple(x) if isinstance(x, (tuple, list)) else (x, x))
    stub("torchvision.transforms")
    stub("torchvision.transforms.functional", resize=None, to_pil_image=None)
    stub("torchvision.ops")
    stub("torchvision.ops.boxes", batched_nms=None, box_area=None)
    from mobile_sam import sam_model_registry
    return sam_model_registry["vit_t"]().eval()


def mobilesam():
    """MobileSAM's image encoder at 1024x1024, and the decoder as AI Hub's MobileSAMDecoder runs
    it: two points embedded, no mask input, the mask decoder's four masks (one selected after)."""
    sam = _mobile_sam()
    pe = sam.prompt_encoder
    with torch.no_grad():
        with FlopCounterMode(display=False) as enc:
            sam.image_encoder(torch.randn(1, 3, 1024, 1024))
        with FlopCounterMode(display=False) as dec:
            sparse = pe._embed_points(torch.rand(1, 2, 2) * 1024, torch.tensor([[1.0, 0.0]]), pad=False)
            dense = torch.zeros(1, 1, 64, 64) + pe.no_mask_embed.weight.reshape(1, -1, 1, 1)
            sam.mask_decoder.predict_masks(torch.randn(1, 256, 64, 64), pe.get_dense_pe(), sparse, dense)
    return enc.get_total_flops() / 2e9, dec.get_total_flops() / 2e9


def _kept(prefixes, why):
    """The file's rows for architectures whose library is not installed."""
    print(f"{why}: keeping the file's {', '.join(prefixes)} rows", file=sys.stderr)
    with (HERE / REFERENCE_MACS).open() as f:
        return [(r["architecture"], float(r["macs_g"]), r["source"]) for r in csv.DictReader(f)
                if r["architecture"].startswith(tuple(prefixes))]


def main() -> int:
    rows = [("bert_base", bert(), "flop_counter on transformers BertModel (bert-base config), 384 tokens"),
            ("distil_bert_base", bert(6), "flop_counter on transformers BertModel (bert-base config, 6 layers: "
             "DistilBERT's shapes), 384 tokens"),
            ("openai_clip", clip(), "flop_counter on transformers CLIPModel (ViT-B/16 config), 224x224 + 77 tokens"),
            ("sd15_text_encoder", sd_text(), "flop_counter on transformers CLIPTextModel (SD 1.5 config), 77 tokens")]
    for s in WHISPER:
        rows.append((f"whisper_{s}_encoder", whisper_encoder(s),
                     f"flop_counter on transformers WhisperModel (whisper-{s} config): encoder + cross K/V"))
        rows.append((f"whisper_{s}_decoder", whisper_decoder(s), "from the whisper config: one step, cache 200"))
    for depth in (50, 101):
        rows.append((f"detr_resnet{depth}", detr(depth), f"flop_counter on transformers DetrForObjectDetection "
                     f"(detr-resnet-{depth} shapes, its own ResNet backbone), 480x480"))
    try:
        rows.append(("sd15_unet", unet(), "flop_counter on diffusers UNet2DConditionModel (SD 1.x config), 64x64 latent"))
        rows.append(("sd15_vae_decoder", vae(), "flop_counter on diffusers AutoencoderKL.decode (SD config), 64x64 latent"))
    except ImportError:
        rows += _kept(("sd15_unet", "sd15_vae"), "diffusers is not installed")
    try:
        enc, dec = mobilesam()
        rows.append(("mobilesam_encoder", enc, "flop_counter on mobile_sam (MobileSAM vit_t) image_encoder, 1024x1024"))
        rows.append(("mobilesam_decoder", dec, "flop_counter on mobile_sam's prompt encoder (2 points) + "
                     "mask_decoder.predict_masks, no mask input"))
    except ImportError:
        rows += _kept(("mobilesam_",), "mobile_sam (mobilesam-mirror) is not installed")
    for model in sorted({k for k in L.LLMS if not k.endswith("_quantized")}):
        for t, kind in ((128, "prompt"), (1, "token")):
            rows.append((f"{model}_{kind}", L.reference_macs(model, t) / 1e9,
                         f"from the {L.LLMS[model].hf} config: {t} token(s) over a {L.LLMS[model].context} cache"))
    with (HERE / REFERENCE_MACS).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["architecture", "macs_g", "source"])
        for name, g, src in rows:
            w.writerow([name, f"{g:.4f}", src])
            print(f"{name:40s} {g:10.3f} GMACs  {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
