"""Fuzz target: images, read by `npurun upscale` (zoo/espcn.read_image) and by ONNX's
ImageDecoder op (the reference kernel). Seeds: the bundled sample.jpg and small PNG, BMP,
TIFF, GIF and WebP files of several modes; mutations of their bytes, and decompression
bombs (a PNG whose header claims up to 2^31 x 2^31 pixels over a few bytes of data). Pass:
an image (a luma array for upscale), or an NpurunError (InputError: "image too large",
"cannot decode")."""
from __future__ import annotations

import io
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_seeds
import fuzzkit
from mutate import _EDIT
from mutate import apply as apply_bytes


def png_header(width: int, height: int, mode: int = 0, depth: int = 8, data: bytes = b"") -> bytes:
    """A PNG of the given IHDR (colour type `mode`) whose IDAT holds `data` deflated."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, mode, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


def seeds() -> list[bytes]:
    from PIL import Image
    out = [(fuzz_seeds.ROOT / "npurun/zoo/sample.jpg").read_bytes()]
    r = np.random.default_rng(0)
    for mode, fmt in [("RGB", "PNG"), ("L", "PNG"), ("RGBA", "PNG"), ("P", "GIF"), ("RGB", "BMP"),
                      ("RGB", "TIFF"), ("RGB", "WEBP"), ("I;16", "PNG"), ("1", "PNG"), ("RGB", "JPEG")]:
        a = r.integers(0, 255, (7, 9, 3), dtype=np.uint8)
        img = Image.fromarray(a, "RGB").convert(mode) if mode != "I;16" else Image.fromarray(a[..., 0].astype(np.uint16) * 200)
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


BOMBS = st.builds(png_header, st.sampled_from([1, 7, 17_000, 20_000, 30_000, 65_535, 2**31 - 1]),
                  st.sampled_from([1, 9, 17_000, 20_000, 30_000, 65_535, 2**31 - 1]),
                  st.sampled_from([0, 2, 3, 4, 6, 5]), st.sampled_from([1, 8, 16, 3]),
                  st.binary(max_size=64))


def image_decoder_model():
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("ImageDecoder", ["encoded"], ["image"], pixel_format="RGB")], "dec",
                          [helper.make_tensor_value_info("encoded", TensorProto.UINT8, ["n"])],
                          [helper.make_tensor_value_info("image", TensorProto.UINT8, ["h", "w", 3])])
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.frontend.onnx import import_model
    from npurun.zoo import espcn
    base = seeds()
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-images-"))
    path = tmp / "photo.png"
    decoder = import_model(image_decoder_model())
    exe = npurun.Executor("reference", parallelism=1)

    def one(data: bytes, via_op: bool):
        if via_op:  # the bytes as an ImageDecoder input tensor
            out = exe.run_sync(decoder, {"encoded": np.frombuffer(data, np.uint8).copy()})["image"]
            assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3
            stats.notes["decoded by ImageDecoder"] += 1
            return out
        path.write_bytes(data)
        y = espcn.luma_to_array(espcn.read_image(path).convert("YCbCr").getchannel("Y"))
        assert y.dtype == np.float32 and y.ndim == 4
        stats.notes["read by upscale"] += 1
        return y

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(st.one_of(st.tuples(st.integers(0, len(base) - 1), st.lists(_EDIT, min_size=1, max_size=6))
                     .map(lambda t: apply_bytes(base[t[0]], t[1])), BOMBS), st.booleans())
    def case(data, via_op):
        stats.case(one, data, via_op)

    case()


@pytest.mark.fuzz
def test_fuzz_images():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_images"))


# ---------------------------------------------------------------- decompression bombs

@pytest.mark.parametrize("side, why", [(20_000, "warning"), (30_000, "error")])
def test_decompression_bombs_are_input_errors(tmp_path, side, why):
    """20000^2 = 400 MP is between MAX_IMAGE_PIXELS (300 MP) and twice it, where Pillow only
    warns: npurun treats the warning as the error, as it does the 900 MP one."""
    from npurun.errors import InputError
    from npurun.zoo import espcn
    p = tmp_path / "bomb.png"
    p.write_bytes(png_header(side, side, data=b"\x00" * 64))
    with pytest.raises(InputError, match="image too large"):
        espcn.read_image(p)


def test_image_decoder_op_refuses_a_bomb():
    import npurun
    from npurun.errors import NpurunError
    from npurun.frontend.onnx import import_model
    g = import_model(image_decoder_model())
    bomb = np.frombuffer(png_header(20_000, 20_000, data=b"\x00" * 64), np.uint8).copy()
    with pytest.raises(NpurunError, match="DecompressionBomb"):
        npurun.Executor("reference").run_sync(g, {"encoded": bomb})


HUGE_CHUNK = """
import io, resource, sys
from PIL import Image
from npurun.errors import InputError
from npurun.zoo import espcn
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GB: the claimed chunk is 2 GB
try:
    print("read", espcn.read_image(sys.argv[1]).size)
except InputError as e:
    print("InputError", e)
"""


def test_a_png_chunk_claiming_2_gb_is_not_an_allocation(tmp_path):
    """Found by the images target: an IDAT chunk whose length field says 0x7ffffff0 made
    Pillow read() that much from the file object, which allocated it first (MemoryError
    under the fuzzers' RLIMIT_AS). Run under a 1 GB address-space cap in a child: the image
    reads (from memory, the chunk is what the file holds) or is an InputError."""
    import subprocess
    import sys

    from PIL import Image
    buf = io.BytesIO()
    Image.new("L", (32, 32), 7).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    at = data.index(b"IDAT") - 4
    data[at:at + 4] = (0x7FFFFFF0).to_bytes(4, "big")
    f = tmp_path / "huge_chunk.png"
    f.write_bytes(bytes(data))
    p = subprocess.run([sys.executable, "-c", HUGE_CHUNK, str(f)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and ("read (32, 32)" in p.stdout or "InputError" in p.stdout), p.stdout + p.stderr[-2000:]
