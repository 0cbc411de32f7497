"""Graph builders for the architectures npusim is calibrated on (random weights: only shapes
matter for timing). `build(name)` returns an NPU-IR Graph; `CALIBRATION` maps AI Hub model
names (the rows of /work/shared/data/aihub_x_elite.csv) to a builder and its input size.

Every builder reproduces the published MAC count of its model (checked in
tests/test_npusim_architectures.py where the CSV lists one); docs/npusim.md lists where a
builder simplifies the original.
"""
from __future__ import annotations

from functools import partial

from ...errors import NpurunError
from . import classification as C
from . import detection as D
from . import speech as S
from . import superres as R

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
    "whisper_tiny_encoder": S.whisper_encoder,
}

# AI Hub model name in the CSV -> architecture name here.
CALIBRATION = {
    "resnet18": "resnet18", "resnet50": "resnet50", "resnet101": "resnet101",
    "wideresnet50": "wideresnet50", "resnext50": "resnext50", "resnext101": "resnext101",
    "mobilenet_v2": "mobilenet_v2", "squeezenet1_1": "squeezenet1_1", "shufflenet_v2": "shufflenet_v2",
    "googlenet": "googlenet", "quicksrnetsmall": "quicksrnetsmall", "quicksrnetmedium": "quicksrnetmedium",
    "quicksrnetlarge": "quicksrnetlarge", "xlsr": "xlsr", "sesr_m5": "sesr_m5",
    "real_esrgan_general_x4v3": "real_esrgan_general_x4v3", "real_esrgan_x4plus": "real_esrgan_x4plus",
    "esrgan": "esrgan", "yolov8_det": "yolov8_det", "whisper_tiny_en/HfWhisperEncoder": "whisper_tiny_encoder",
}


def build(name: str, **kw):
    fn = ARCHITECTURES.get(name)
    if fn is None:
        raise NpurunError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
    return fn(**kw)


__all__ = ["ARCHITECTURES", "CALIBRATION", "build"]
