"""Accuracy gates of the precision plans on real third-party models (issue D): PP-OCRv4 cls
keeps its class and det its text regions (IoU >= 0.9 of the thresholded map, from which the
boxes are drawn) against FP32; MiniLM-int8 keeps its embeddings (cosine >= 0.99). Calibration
uses other rendered images / other token ids than the ones checked."""
import numpy as np
import pytest

import npurun
from npurun.compiler import compile

from .fetch import fetch
from .test_real_models import _ppocr_input, _text_image

pytestmark = pytest.mark.models


def _run(g, feeds):
    return list(npurun.Executor("cpu").run_sync(g, feeds).values())


@pytest.mark.parametrize("precision", ["auto", "int8"])
def test_ppocr_cls_same_class(precision):
    cal = [{"x": _ppocr_input(_text_image(192, 48, [t], 30))} for t in ("calibrate", "ranges 123")]
    g32 = npurun.load(fetch("ppocr_cls"))
    g = compile(g32, precision=precision, calibration=cal)
    assert any(n.precision for n in g.nodes)
    img = _text_image(192, 48, ["upside"], 30)
    for im in (img, img.rotate(180)):
        x = _ppocr_input(im)
        (want,), (got,) = _run(g32, {"x": x}), _run(g, {"x": x})
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist(), (got, want)


def test_ppocr_det_same_regions_auto():
    cal = [{"x": _ppocr_input(_text_image(320, 320, ["calibration text", "OCR 42"], 30))}]
    g32 = npurun.load(fetch("ppocr_det"))
    g = compile(g32, precision="auto", calibration=cal)
    assert any(n.precision for n in g.nodes)
    x = _ppocr_input(_text_image(640, 640, ["npurun makes NPUs usable", "OCR 2026 det", "ESPCN x3 4K"], 40))
    (want,), (got,) = _run(g32, {"x": x}), _run(g, {"x": x})
    a, b = want > 0.3, got > 0.3
    iou = (a & b).sum() / (a | b).sum()
    print(f"det IoU auto vs fp32: {iou:.4f}")
    assert a.sum() > 1000 and iou >= 0.9, iou


def _ids(rng, n=64):
    ids = rng.integers(1000, 30000, (1, n)).astype(np.int64)
    ids[0, 0], ids[0, -1] = 101, 102
    return {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64),
            "token_type_ids": np.zeros((1, n), np.int64)}


def test_minilm_embeddings_keep_cosine(rng):
    g32 = npurun.load(fetch("minilm_int8"))
    g = compile(g32, precision="auto", calibration=[_ids(rng), _ids(rng)])
    assert any(n.precision for n in g.nodes)
    feeds = _ids(rng)
    want, got = _run(g32, feeds)[0][0].mean(0), _run(g, feeds)[0][0].mean(0)
    cos = float(want @ got / np.linalg.norm(want) / np.linalg.norm(got))
    print(f"MiniLM cosine auto vs fp32: {cos:.6f}")
    assert cos >= 0.99, cos
