"""A PNG encoder for 8-bit L, RGB and RGBA frames that is ~3x faster than Pillow's.

Why not Pillow's: at compress_level 1 Pillow spends ~60% of a 4K frame's 0.5 s choosing a
filter for each row among the five PNG defines (measured: 0.28 s of it with no compression at
all), and the choice is not configurable. Here every row uses the "up" filter (row minus the
row above: one vectorised subtraction), which suits photos and upscaled frames as well, and
the deflate is zlib-ng's where it is installed (2-3x the stdlib zlib's speed at level 2;
files the size of Pillow's level 1). Both release the GIL, so a batch job's encoder threads
deflate in parallel. Decoding stays Pillow's; tests/test_png.py checks that Pillow reads back
every pixel.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

try:  # zlib-ng's deflate: same format, faster (a dependency of npurun; the stdlib's otherwise)
    from zlib_ng import zlib_ng as _deflate
except ImportError:  # pragma: no cover - an install without it still writes valid PNGs
    _deflate = zlib

_COLOR_TYPE = {"L": 0, "RGB": 2, "RGBA": 6}
_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_IDAT_MAX = 1 << 30  # bytes per IDAT chunk (the format's limit is 2^31 - 1)


def supports(mode: str) -> bool:
    return mode in _COLOR_TYPE


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def encode(pixels: np.ndarray, mode: str, level: int = 2) -> bytes:
    """PNG bytes of an (H, W) or (H, W, C) uint8 array in `mode` (L, RGB or RGBA)."""
    a = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w = a.shape[:2]
    rows = a.reshape(h, -1)
    filtered = np.empty((h, rows.shape[1] + 1), np.uint8)
    filtered[:, 0] = 2  # filter type "up" on every row (the first row's "above" is zeros)
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])  # mod 256, as the format wants
    data = _deflate.compress(filtered, level)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPE[mode], 0, 0, 0)
    idat = b"".join(_chunk(b"IDAT", data[k:k + _IDAT_MAX]) for k in range(0, max(len(data), 1), _IDAT_MAX))
    return _SIGNATURE + _chunk(b"IHDR", ihdr) + idat + _chunk(b"IEND", b"")
