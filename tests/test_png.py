"""zoo/png.py, the fast PNG writer of upscaled frames: Pillow (an independent decoder) reads
back every pixel, at every level, mode and odd size, across IDAT chunk boundaries."""
import io

import numpy as np
import pytest
from PIL import Image

from npurun.zoo import espcn, png


@pytest.mark.parametrize("mode,channels", [("L", None), ("RGB", 3), ("RGBA", 4)])
@pytest.mark.parametrize("size", [(1, 1), (7, 3), (33, 64), (480, 270)])
def test_pillow_reads_back_every_pixel(rng, mode, channels, size):
    w, h = size
    shape = (h, w) if channels is None else (h, w, channels)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    a[h // 2:] = a[h // 2:] // 16 * 16  # smooth and noisy rows both
    for level in (0, 1, 2, 6, 9):
        data = png.encode(a, mode, level)
        img = Image.open(io.BytesIO(data))
        img.verify()  # chunk CRCs and structure
        img = Image.open(io.BytesIO(data))
        assert img.mode == mode and img.size == (w, h)
        np.testing.assert_array_equal(np.asarray(img), a)


def test_split_idat_chunks(rng, monkeypatch):
    monkeypatch.setattr(png, "_IDAT_MAX", 100)
    a = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    data = png.encode(a, "RGB", 1)
    assert data.count(b"IDAT") > 10
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), a)


def test_encode_image_uses_it_and_falls_back_to_pillow(rng, tmp_path):
    rgb = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    assert espcn.encode_image(rgb, "x.png") == png.encode(np.asarray(rgb), "RGB", espcn.PNG_LEVEL)
    la = rgb.convert("LA")  # a mode this writer does not take: Pillow writes it
    back = Image.open(io.BytesIO(espcn.encode_image(la, "x.png")))
    assert back.mode == "LA" and np.array_equal(np.asarray(back), np.asarray(la))
