"""ESPCN super-resolution recipe: colour photo in, photo `scale`x larger out.

As in the ESPCN paper, only luma goes through the network: the photo is split into YCbCr,
Y (as float32 in [0, 1], shape (1, 1, H, W)) is upscaled by the model, Cb and Cr are upscaled
bicubically (the eye is far less sensitive to chroma detail), and the three are merged back.
"""
from __future__ import annotations

import io
import os
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import InputError, NpurunError
from ..ir.graph import Graph
from ..ir.shapes import parse_affine
from ..util import atomic_write
from . import png

# Refuse images over ~300 megapixels instead of letting Pillow decode a decompression bomb.
Image.MAX_IMAGE_PIXELS = 300_000_000
_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".tif": "TIFF",
            ".tiff": "TIFF", ".webp": "WEBP"}


def model_scale(g: Graph) -> int:
    """The upscaling factor a model declares: output dims of the form `S*H`."""
    out = g.values[g.outputs[0]].shape
    if len(out) == 4 and isinstance(out[-1], str):
        p = parse_affine(out[-1])
        if p and p[2] == 0:
            return p[0]
    raise NpurunError(f"{g.source}: cannot tell the model's scale from its output shape {list(out)}; "
                      f"expected [1, 1, S*H, S*W]")


def read_image(path: str | os.PathLike) -> Image.Image:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        # Pillow only warns between MAX_IMAGE_PIXELS and twice that; npurun refuses there too.
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            # From memory, not the file: a corrupt chunk length (a PNG IDAT claiming 2 GB) makes
            # Pillow read() that many bytes, which a file object allocates up front (a
            # MemoryError, found by tests/fuzz) and BytesIO does not.
            img = Image.open(io.BytesIO(path.read_bytes()))
            img.load()
    except UnidentifiedImageError:
        raise InputError(f"{path}: not an image (Pillow cannot identify its format)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"{path}: image too large ({e})") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, ZeroDivisionError) as e:
        # (Pillow's decoders let struct.error, IndexError ... out of some corrupt files)
        raise InputError(f"{path}: cannot decode the image ({type(e).__name__}: {e})") from None
    return img


def output_format(path: str | os.PathLike) -> str:
    ext = Path(path).suffix.lower()
    if ext not in _FORMATS:
        raise InputError(f"{path}: unknown output format {ext or '(none)'!r}; use one of "
                         f"{', '.join(sorted(_FORMATS))}")
    return _FORMATS[ext]


# zlib level of PNG outputs (zoo/png.py): 2 writes a 4K frame in ~0.15 s here, files the size
# of Pillow's level 1 (which takes ~0.5 s; its default, 6, ~2 s); the pixels never differ.
PNG_LEVEL = 2


def encode_image(img: Image.Image, path: str | os.PathLike, png_level: int = PNG_LEVEL) -> bytes:
    """The bytes of `img` in the format `path`'s extension names."""
    fmt = output_format(path)
    if fmt == "JPEG" and img.mode == "RGBA":
        img = img.convert("RGB")
    if fmt == "PNG" and png.supports(img.mode):
        return png.encode(np.asarray(img), img.mode, png_level)
    buf = io.BytesIO()
    opts = {"quality": 95} if fmt == "JPEG" else {"compress_level": png_level} if fmt == "PNG" else {}
    img.save(buf, format=fmt, **opts)
    return buf.getvalue()


def write_image(img: Image.Image, path: str | os.PathLike, png_level: int = PNG_LEVEL) -> None:
    atomic_write(path, encode_image(img, path, png_level))


def luma_to_array(y: Image.Image) -> np.ndarray:
    return (np.asarray(y, dtype=np.float32) / 255.0)[None, None]


def array_to_luma(a: np.ndarray) -> Image.Image:
    return Image.fromarray(np.round(np.clip(a[0, 0], 0.0, 1.0) * 255.0).astype(np.uint8), "L")


def merge_ycbcr(y: np.ndarray, cb: Image.Image, cr: Image.Image, size: tuple[int, int]) -> Image.Image:
    """RGB from the network's float luma y (in [0, 1]) and the chroma planes upscaled bicubically
    (8-bit, Pillow), with the JFIF YCbCr -> RGB matrix in float, rounded once.

    Why not Pillow's merge of three 8-bit planes: rounding the luma to 8 bits and then Pillow's
    fixed-point conversion cost 0.06 dB of the luma gain on the held-out photos (0.10 on
    chelsea); this keeps all but ~0.015 (docs/espcn.md). One C pass (csrc/color.c) where the
    cpu kernels are built, ~150 ms of NumPy on a 4K frame otherwise."""
    cb8 = np.asarray(cb.resize(size, Image.BICUBIC), dtype=np.uint8)
    cr8 = np.asarray(cr.resize(size, Image.BICUBIC), dtype=np.uint8)
    y = np.ascontiguousarray(y, dtype=np.float32)
    from ..backends.cpu import native
    if native.LIB is not None:
        planes = np.empty((3,) + y.shape, np.uint8)
        native.LIB.npr_ycc_to_rgb(native.ptr(y), native.ptr(cb8), native.ptr(cr8), native.ptr(planes[0]),
                                  native.ptr(planes[1]), native.ptr(planes[2]), y.size)
        return Image.merge("RGB", [Image.fromarray(p, "L") for p in planes])
    rgb = np.empty(y.shape + (3,), np.uint8)
    yf = np.clip(np.nan_to_num(y), 0.0, 1.0) * np.float32(255.0)
    cbf, crf = cb8.astype(np.float32) - 128.0, cr8.astype(np.float32) - 128.0
    for k, (a, b) in enumerate(((0.0, 1.402), (-0.344136, -0.714136), (1.772, 0.0))):
        c = yf + (np.float32(a) * cbf + np.float32(b) * crf)
        rgb[:, :, k] = np.clip(np.rint(c, out=c), 0, 255, out=c)
    return Image.fromarray(rgb, "RGB")


def upscale(img: Image.Image, run_luma, scale: int) -> Image.Image:
    """Upscale `img` by `scale`; `run_luma` maps a (1, 1, H, W) float32 array to (1, 1, sH, sW)."""
    alpha = None
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
        alpha = img.getchannel("A")
    gray = img.mode in ("L", "I", "I;16", "F", "1")
    img = img.convert("L" if gray else "RGB")
    size = (img.width * scale, img.height * scale)
    if gray:
        out = array_to_luma(run_luma(luma_to_array(img)))
    else:
        y, cb, cr = img.convert("YCbCr").split()
        out = merge_ycbcr(run_luma(luma_to_array(y))[0, 0], cb, cr, size)
    if alpha is not None:
        out = out.convert("RGBA")
        out.putalpha(alpha.resize(size, Image.BICUBIC))
    return out
