"""Graph builders for the architectures npusim is calibrated on (random weights: only shapes
matter for timing). `build(name)` returns an NPU-IR Graph; `CALIBRATION` maps AI Hub model
names (the rows of npurun/backends/npusim/data/aihub_x_elite.csv) to an architecture here, and
`llm.LLMS` the names of the LLM table (aihub_x_elite_llm.csv) to their configurations, built
as `NAME_prompt` (128 tokens) and `NAME_token` (1 token) over the model's KV cache.

Every builder reproduces the published MAC count of its model (AI Hub's where the table lists
one, else the reference counts of npurun/backends/npusim/data/reference_macs.csv; checked in
tests/test_npusim_architectures.py); docs/npusim.md lists where a builder simplifies.
"""
from __future__ import annotations

from functools import partial

from ...errors import NpurunError
from . import classification as C
from . import detection as D
from . import diffusion as SD
from . import llm as L
from . import modern as M
from . import sam as S
from . import superres as R
from . import transformer as T

ARCHITECTURES = {
    "resnet18": partial(C.resnet, 18),
    "resnet50": partial(C.resnet, 50),
    "resnet101": partial(C.resnet, 101, name="resnet101"),
    "wideresnet50": partial(C.resnet, 50, width_mult=2, name="wideresnet50"),
    "resnext50": partial(C.resnet, 50, groups=32, width_per_group=4, name="resnext50"),
    "resnext101": partial(C.resnet, 101, groups=32, width_per_group=8, name="resnext101"),
    "mobilenet_v2": C.mobilenet_v2,
    "squeezenet1_1": C.squeezenet1_1,
    "shufflenet_v2": C.shufflenet_v2,
    "googlenet": C.googlenet,
    "quicksrnetsmall": partial(R.quicksrnet, "small"),
    "quicksrnetmedium": partial(R.quicksrnet, "medium"),
    "quicksrnetlarge": partial(R.quicksrnet, "large"),
    "xlsr": R.xlsr,
    "sesr_m5": R.sesr_m5,
    "real_esrgan_general_x4v3": R.srvgg_compact,
    "real_esrgan_x4plus": R.rrdbnet,
    "esrgan": partial(R.rrdbnet, name="esrgan"),
    "yolov8_det": D.yolov8,
    "bert_base": T.bert,
    "distil_bert_base": partial(T.bert, layers=6, name="distil_bert_base"),
    "vit": T.vit,
    "openai_clip": T.clip,
    "convnext_tiny": M.convnext_tiny,
    "swin_tiny": M.swin_tiny,
    "whisper_tiny_encoder": partial(T.whisper_encoder, "tiny"),
    "whisper_tiny_decoder": partial(T.whisper_decoder, "tiny"),
    "whisper_base_encoder": partial(T.whisper_encoder, "base"),
    "whisper_base_decoder": partial(T.whisper_decoder, "base"),
    "sd15_text_encoder": T.sd_text_encoder,
    "detr_resnet50": partial(T.detr, 50),
    "detr_resnet101": partial(T.detr, 101),
    "sd15_unet": SD.sd15_unet,
    "sd15_vae_decoder": SD.sd15_vae_decoder,
    "mobilesam_encoder": S.mobilesam_encoder,
    "mobilesam_decoder": S.mobilesam_decoder,
}
for _m in L.LLMS:
    if not _m.endswith("_quantized"):
        ARCHITECTURES[f"{_m}_prompt"] = partial(L.llm, _m, 128, name=f"{_m}_prompt")
        ARCHITECTURES[f"{_m}_token"] = partial(L.llm, _m, 1, name=f"{_m}_token")

# AI Hub model name in the CSV (without a `_quantized` suffix) -> architecture name here.
CALIBRATION = {
    **{k: k for k in ("resnet18", "resnet50", "resnet101", "wideresnet50", "resnext50", "resnext101",
                      "mobilenet_v2", "squeezenet1_1", "shufflenet_v2", "googlenet", "quicksrnetsmall",
                      "quicksrnetmedium", "quicksrnetlarge", "xlsr", "sesr_m5", "real_esrgan_general_x4v3",
                      "real_esrgan_x4plus", "esrgan", "yolov8_det", "vit", "openai_clip", "convnext_tiny",
                      "swin_tiny", "detr_resnet50", "detr_resnet101")},
    "convnext_tiny_w8a8": "convnext_tiny",
    "bert_base_uncased_hf": "bert_base", "electra_bert_base_discrim_google": "bert_base",
    "distil_bert_base_uncased_hf": "distil_bert_base",
    "whisper_tiny/HfWhisperEncoder": "whisper_tiny_encoder", "whisper_tiny_en/HfWhisperEncoder": "whisper_tiny_encoder",
    "whisper_tiny/HfWhisperDecoder": "whisper_tiny_decoder", "whisper_tiny_en/HfWhisperDecoder": "whisper_tiny_decoder",
    "whisper_base/HfWhisperEncoder": "whisper_base_encoder", "whisper_base_en/HfWhisperEncoder": "whisper_base_encoder",
    "whisper_base/HfWhisperDecoder": "whisper_base_decoder", "whisper_base_en/HfWhisperDecoder": "whisper_base_decoder",
    "stable_diffusion_v1_5/text_encoder": "sd15_text_encoder", "stable_diffusion_v1_5/unet": "sd15_unet",
    "stable_diffusion_v1_5/vae": "sd15_vae_decoder",
    "mobilesam/MobileSAMEncoder": "mobilesam_encoder", "mobilesam/MobileSAMDecoder": "mobilesam_decoder",
    "stable_diffusion_v1_5_quantized/TextEncoder_Quantized": "sd15_text_encoder",
    "stable_diffusion_v1_5_quantized/UNet_Quantized": "sd15_unet",
    "stable_diffusion_v1_5_quantized/VAEDecoder_Quantized": "sd15_vae_decoder",
}


def build(name: str, **kw):
    fn = ARCHITECTURES.get(name)
    if fn is None:
        raise NpurunError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return fn(**kw)


__all__ = ["ARCHITECTURES", "CALIBRATION", "build"]
