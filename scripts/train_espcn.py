"""Train ESPCN x3 (Shi et al. 2016) on the photos shipped in the scikit-image wheel.

Writes npurun/zoo/espcn_x3.onnx (built by hand with onnx.helper), espcn_x3.json
(data split, PSNR table, command line) and sample.jpg (a held-out photo for the demo).

Data protocol (tests recompute it independently, so keep it exact):
  HR  = Pillow RGB, top-left crop to width/height divisible by 3
  LR  = HR.resize((w//3, h//3), BICUBIC)
  Y   = channel 0 of Pillow's .convert("YCbCr"), float32 / 255
  PSNR on Y over the full image, peak 1.0; ESPCN output clipped to [0,1] and
  rounded to 8 bit; baseline = Y of LR.resize((w, h), BICUBIC).

Training options beyond the defaults (all off by default; docs/espcn.md has the recipe):
  --center C   train on luma - C (targets - C): better-conditioned for tanh nets; folded
               exactly into conv1/conv3 biases at export, so the graph and its input stay.
               conv1's padding is emulated as the exported model sees it (raw 0 = -C).
  --border R   exact windows: loss only where the patch-edge padding cannot reach, photo
               edges masked as the exported model sees them (R = 4, the receptive field).
  --clip N     gradient-norm clipping; --warmup S linear LR warm-up.
  --contrast A random contrast a in [1/A, A] (log-uniform) around each patch's mean, the same
               on the LR and HR patch (bicubic is linear, so the pair stays consistent).
  --scene-weight W  draw the camera photographs of scenes (SCENES) W times as often.
  --val-every  gain on the whole training photos, to choose settings without the held-out set.

Example:  python scripts/train_espcn.py --steps 30000 --seed 0
"""
import argparse
import json
import pathlib
import shutil
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

SCALE = 3
REPO = pathlib.Path(__file__).resolve().parents[1]
# Natural photos only: the chessboards, logo, phantom, colour wheel, horse silhouette
# and the tiny files (microaneurysms, multipage, gif) are synthetic or too small.
TRAIN = ["brick.png", "camera.png", "cell.png", "clock_motion.png", "coins.png",
         "grass.png", "gravel.png", "hubble_deep_field.jpg", "ihc.png", "moon.png",
         "motorcycle_left.png", "motorcycle_right.png", "page.png", "retina.jpg", "text.png"]
# Camera photographs of everyday scenes and materials: the domain `npurun upscale` is for.
# The rest are microscopy, astronomy, documents and a deliberately motion-blurred photo.
SCENES = ["brick.png", "camera.png", "coins.png", "grass.png", "gravel.png",
          "motorcycle_left.png", "motorcycle_right.png"]
HELD_OUT = ["astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg"]
SAMPLE = "rocket.jpg"  # public domain (SpaceX), so it may ship inside our package


def skimage_data_dir():
    import skimage  # only to locate the photos inside the wheel
    return pathlib.Path(skimage.__file__).parent / "data"


def luma(img):
    return np.asarray(img.convert("YCbCr"), dtype=np.float32)[:, :, 0] / 255.0


def load_pair(path, zoom=1.0):
    """HR luma, LR luma and bicubic-upscaled luma for one photo, per the protocol.

    zoom < 1 first shrinks the photo (training augmentation only): a smaller
    copy is a new, sharper HR image with the same content statistics.
    """
    hr = Image.open(path).convert("RGB")
    if zoom != 1.0:
        hr = hr.resize((round(hr.size[0] * zoom), round(hr.size[1] * zoom)), Image.BICUBIC)
    w, h = hr.size[0] - hr.size[0] % SCALE, hr.size[1] - hr.size[1] % SCALE
    hr = hr.crop((0, 0, w, h))
    lr = hr.resize((w // SCALE, h // SCALE), Image.BICUBIC)
    return luma(hr), luma(lr), luma(lr.resize((w, h), Image.BICUBIC))


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(1.0 / mse))


class ESPCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 64, 5, padding=2)
        self.conv2 = nn.Conv2d(64, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, SCALE * SCALE, 3, padding=1)
        self.shuffle = nn.PixelShuffle(SCALE)  # == ONNX DepthToSpace(mode="CRD")

    def forward(self, x, mask=None, pad1=None):
        # mask (N, 1, H, W): 1 inside the photo, 0 outside. Zeroing the hidden activations
        # outside reproduces the zero padding that the exported model's conv2/conv3 see at
        # the photo's edges, so a window cut at an edge trains exactly what ships.
        m = (lambda t: t) if mask is None else (lambda t: t * mask)
        if pad1 is None:
            x = m(torch.tanh(self.conv1(x)))
        else:  # conv1's zero padding as seen by raw luma: pad the centred input with -c
            x = nn.functional.pad(x, [2] * 4, value=pad1)
            x = m(torch.tanh(nn.functional.conv2d(x, self.conv1.weight, self.conv1.bias)))
        x = m(torch.tanh(self.conv2(x)))
        return self.shuffle(self.conv3(x))


class PatchSampler:
    """Random aligned LR/HR patches with the 8 flips/rotations.

    Images are picked in proportion to their area so that every pixel is equally
    likely; nearly flat patches (black borders of retina/hubble) are mostly
    rejected because they teach nothing and would dilute the batch.

    border=0: x is a p x p LR patch, y its 3p x 3p HR patch; the loss then also covers
    outputs that the conv padding at the patch edges corrupts (4 LR pixels deep: the
    receptive-field radius of 5x5 + 3x3 + 3x3), more than half of a 24x24 patch.
    border=R>0: x is a (p+2R)^2 window whose central p x p outputs are exact; the
    window may reach up to p/2 beyond the photo, where x is 0 (the exported model's
    zero padding) and xm/ym masks say what is inside, so edges are trained as evaluated.
    """

    def __init__(self, pairs, patch, rng, per_photo=False, min_std=0.01, border=0,
                 weights=None, contrast=1.0):
        self.pairs, self.patch, self.rng, self.min_std = pairs, patch, rng, min_std
        self.border, self.contrast = border, contrast
        areas = np.array([lr.size for _, lr in pairs], dtype=np.float64)
        if per_photo:
            areas = np.ones_like(areas)
        if weights is not None:
            areas = areas * np.asarray(weights, dtype=np.float64)
        self.p = areas / areas.sum()
        if border:  # zero-pad each photo once: LR by R + p/2, HR by 3x that
            q, s = border + patch // 2, SCALE
            self.padded = [(np.pad(hr, q * s), np.pad(lr, q), np.pad(np.ones_like(lr), q))
                           for hr, lr in pairs]

    def one(self):
        p, s, r = self.patch, SCALE, self.border
        for _ in range(10):
            k = self.rng.choice(len(self.pairs), p=self.p)
            hr, lr = self.pairs[k]
            lo, hi = (-(p // 2), lr.shape[0] - p + p // 2) if r else (0, lr.shape[0] - p)
            i = self.rng.integers(lo, hi + 1)
            lo, hi = (-(p // 2), lr.shape[1] - p + p // 2) if r else (0, lr.shape[1] - p)
            j = self.rng.integers(lo, hi + 1)
            if r:  # (i, j): top-left of the p x p loss region in photo coordinates
                hp, lp, mp = self.padded[k]
                a, b = i + p // 2, j + p // 2  # window top-left in the padded arrays
                x, xm = lp[a:a + p + 2 * r, b:b + p + 2 * r], mp[a:a + p + 2 * r, b:b + p + 2 * r]
                a, b = (a + r) * s, (b + r) * s
                y = hp[a:a + p * s, b:b + p * s]
                inner = x[r:-r, r:-r][xm[r:-r, r:-r] > 0]
                if inner.size > p and inner.std() > self.min_std:
                    break
            else:
                x = lr[i:i + p, j:j + p]
                if x.std() > self.min_std:
                    break
        if not r:
            xm = None
            y = hr[i * s:(i + p) * s, j * s:(j + p) * s]
        if self.contrast != 1.0:
            # Contrast around the patch mean: LR = bicubic(HR) is linear, so a*(t - m) + m
            # keeps the pair consistent (up to Pillow's 8-bit rounding); teaches the
            # flat-lit scans' edges at the contrasts of sunlit photos and vice versa.
            a = float(np.exp(self.rng.uniform(-1, 1) * np.log(self.contrast)))
            m = float(x.mean() if xm is None else x[xm > 0].mean())
            x, y = a * (x - m) + m, a * (y - m) + m
            if xm is not None:
                x = x * xm  # outside the photo stays a raw 0, as the exported model pads
        k = int(self.rng.integers(8))  # dihedral group: rot90^k, optional transpose
        out = [np.rot90(t, k % 4) for t in (x, y, xm) if t is not None]
        if k >= 4:
            out = [t.T for t in out]
        return out

    def batch(self, n):
        """x (n,1,P,P), y (n,1,3p,3p) and, with border>0, the LR mask of x (n,1,P,P)."""
        cols = zip(*(self.one() for _ in range(n)))
        return [torch.from_numpy(np.stack(c)[:, None].copy()) for c in cols]


def fold_center(model, c):
    """A model on raw luma equal (away from the photo edges) to `model` on luma - c
    with targets - c: conv1(x - c) = conv1(x) - c * sum(W1), and + c on every conv3
    output channel (pixel shuffle only moves them). Same graph, same input."""
    out = ESPCN()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["conv1.bias"] -= c * sd["conv1.weight"].sum(dim=(1, 2, 3))
    sd["conv3.bias"] += c
    out.load_state_dict(sd)
    return out.eval()


def unfold_center(model, c):
    """Inverse of fold_center, to continue training a raw-luma model on centred luma."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["conv1.bias"] += c * sd["conv1.weight"].sum(dim=(1, 2, 3))
    sd["conv3.bias"] -= c
    model.load_state_dict(sd)


def train_gain(model, pairs):
    """Mean luma-PSNR gain over bicubic of a raw-luma model on whole training photos:
    the signal for choosing recipe settings (never the held-out photos)."""
    gains = []
    with torch.no_grad():
        for hr, lr, bic in pairs:
            sr = model(torch.from_numpy(lr)[None, None])[0, 0].numpy()
            sr = np.round(np.clip(sr, 0, 1) * 255) / 255
            gains.append(psnr(sr, hr) - psnr(bic, hr))
    return float(np.mean(gains))


def build_onnx(model):
    """Write the graph node by node so that names and layout are exactly ours."""
    inits = [numpy_helper.from_array(t.detach().numpy().astype(np.float32), name)
             for name, t in model.state_dict().items()]
    conv = lambda i, src, dst, k: helper.make_node(
        "Conv", [src, f"conv{i}.weight", f"conv{i}.bias"], [dst], name=f"conv{i}",
        kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1], dilations=[1, 1], group=1)
    nodes = [
        conv(1, "input", "conv1_out", 5),
        helper.make_node("Tanh", ["conv1_out"], ["tanh1_out"], name="tanh1"),
        conv(2, "tanh1_out", "conv2_out", 3),
        helper.make_node("Tanh", ["conv2_out"], ["tanh2_out"], name="tanh2"),
        conv(3, "tanh2_out", "conv3_out", 3),
        helper.make_node("DepthToSpace", ["conv3_out"], ["output"], name="pixel_shuffle",
                         blocksize=SCALE, mode="CRD"),
    ]
    graph = helper.make_graph(
        nodes, "espcn_x3",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, None, None])],
        initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="npurun/scripts/train_espcn.py")
    m.ir_version = 8  # the oldest IR that allows opset 17: widest runtime support
    m.doc_string = "ESPCN x3 super-resolution on luma Y in [0,1]; output is not clipped."
    onnx.checker.check_model(m, full_check=True)
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30000, help="Adam steps (sets the LR schedule)")
    ap.add_argument("--minutes", type=float, default=12.0,
                    help="hard wall-clock cap on training; if hit, the run is not reproducible")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--patch", type=int, default=24, help="LR patch side (HR is 3x)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--head-lr", type=float, default=1.0, help="last layer LR multiplier")
    ap.add_argument("--warmup", type=int, default=0, help="linear LR warm-up steps")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="clip the gradient's global L2 norm to this (0: off)")
    ap.add_argument("--center", type=float, default=0.0,
                    help="train on luma - C with targets - C; folded into the biases at export")
    ap.add_argument("--border", type=int, default=0,
                    help="exact-window training: loss only on outputs free of patch-edge padding "
                         "(4 = the receptive-field radius), photo edges as the exported model sees them")
    ap.add_argument("--zooms", default="1", help="comma list of training photo rescales")
    ap.add_argument("--init", type=pathlib.Path,
                    help="start from this espcn_x3.onnx's weights (continue a training run)")
    ap.add_argument("--per-photo", action="store_true",
                    help="sample every training photo equally often (not by area)")
    ap.add_argument("--scene-weight", type=float, default=1.0,
                    help="draw the camera photographs of scenes (SCENES) this many times as often")
    ap.add_argument("--contrast", type=float, default=1.0,
                    help="random patch contrast in [1/A, A] (log-uniform); 1: off")
    ap.add_argument("--val-every", type=int, default=0,
                    help="print the gain over bicubic on the whole training photos every N steps")
    ap.add_argument("--no-held-out", action="store_true",
                    help="recipe probe: skip the held-out evaluation (write the model only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "npurun" / "zoo")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(args.seed)
    data = skimage_data_dir()

    zooms = [float(z) for z in args.zooms.split(",")]
    pairs = [load_pair(data / f, z)[:2] for f in TRAIN for z in zooms]
    weights = [args.scene_weight if f in SCENES else 1.0 for f in TRAIN for _ in zooms]
    sampler = PatchSampler(pairs, args.patch, rng, per_photo=args.per_photo, border=args.border,
                           weights=weights, contrast=args.contrast)
    val = [load_pair(data / f) for f in TRAIN] if args.val_every else []
    model = ESPCN()
    if args.init:  # continue from an exported model: its initializers are our state dict
        init = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(args.init).graph.initializer}
        model.load_state_dict(init)
        unfold_center(model, args.center)
    # The paper trains the last layer 10x slower (SGD). With Adam that only slows
    # convergence (held-out gain +0.55 dB after 5k steps at 1x, +0.69 after 30k at 0.1x).
    head = list(model.conv3.parameters())
    body = list(model.conv1.parameters()) + list(model.conv2.parameters())
    opt = torch.optim.Adam([{"params": body, "lr": args.lr},
                            {"params": head, "lr": args.lr * args.head_lr}])
    base = [g["lr"] for g in opt.param_groups]
    # Cosine decay to 1% over the step budget: a step-based (not time-based)
    # schedule keeps the run reproducible for a given --steps.
    sched = lambda s: (min(1.0, (s + 1) / args.warmup) if args.warmup else 1.0) * (
        0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * s / args.steps)))
    c, r3 = args.center, SCALE * args.border

    t0, step, running, clipped, peak = time.time(), 0, None, 0, 0.0
    while step < args.steps:
        if time.time() - t0 > args.minutes * 60:
            print(f"wall-clock cap hit at step {step}", file=sys.stderr)
            break
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * sched(step)
        if args.border:  # x (n,1,p+2R,p+2R) with its photo mask, y (n,1,3p,3p)
            x, y, xm = sampler.batch(args.batch)
            out = model(x - c, xm)[:, :, r3:-r3, r3:-r3]  # outside the photo x - c = -c: raw 0
            ym = nn.functional.interpolate(xm[:, :, args.border:-args.border,
                                              args.border:-args.border], scale_factor=SCALE)
            loss = (((out - (y - c)) * ym) ** 2).sum() / ym.sum()
        else:
            x, y = sampler.batch(args.batch)
            loss = nn.functional.mse_loss(model(x - c, pad1=-c if c else None), y - c)
        opt.zero_grad()
        loss.backward()
        # Global gradient norm (clipped only with --clip): logged to choose --clip.
        norm = float(nn.utils.clip_grad_norm_(model.parameters(), args.clip or float("inf")))
        clipped, peak = clipped + int(args.clip > 0 and norm > args.clip), max(peak, norm)
        opt.step()
        step += 1
        running = loss.item() if running is None else 0.99 * running + 0.01 * loss.item()
        if step % 1000 == 0:
            print(f"step {step:6d}  loss {running:.3e}  ({psnr_of(running):.2f} dB)  "
                  f"{time.time() - t0:6.0f} s  max |grad| {peak:.2g}"
                  + (f"  clipped {clipped}" if args.clip else ""), flush=True)
            peak = 0.0
        if val and (step % args.val_every == 0 or step == args.steps):
            print(f"step {step:6d}  training-photo gain {train_gain(fold_center(model, c), val):+.3f} dB",
                  flush=True)
    train_s = time.time() - t0
    model = fold_center(model, c)  # raw luma in, as the graph ships

    # Export, then check that ONNX Runtime reproduces the torch model.
    proto = build_onnx(model)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.from_numpy(np.random.default_rng(1).random((1, 1, 37, 53), dtype=np.float32))
    with torch.no_grad():
        ref = model(x).numpy()
    got = sess.run(["output"], {"input": x.numpy()})[0]
    diff = float(np.abs(ref - got).max())
    assert got.shape == (1, 1, 111, 159) and diff < 1e-5, (got.shape, diff)
    print(f"\ntrained {step} steps in {train_s:.0f} s; onnx vs torch max |diff| {diff:.1e}")
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["scripts/train_espcn.py"] + [a for a in sys.argv[1:]])
    if args.no_held_out:
        onnx.save(proto, args.out / "espcn_x3.onnx")
        return

    # Evaluate the exported model (what ships), never the held-out photos in training.
    table = {}
    for f in HELD_OUT:
        hr, lr, bic = load_pair(data / f)
        sr = sess.run(["output"], {"input": lr[None, None]})[0][0, 0]
        sr = np.round(np.clip(sr, 0, 1) * 255) / 255
        table[f] = {"bicubic": round(psnr(bic, hr), 4), "espcn": round(psnr(sr, hr), 4)}
    gains = [v["espcn"] - v["bicubic"] for v in table.values()]
    mean_gain = float(np.mean(gains))

    print(f"{'photo':<16}{'bicubic':>10}{'ESPCN':>10}{'gain':>8}")
    for (f, v), g in zip(table.items(), gains):
        print(f"{f:<16}{v['bicubic']:10.3f}{v['espcn']:10.3f}{g:+8.3f}")
    print(f"{'mean':<16}{np.mean([v['bicubic'] for v in table.values()]):10.3f}"
          f"{np.mean([v['espcn'] for v in table.values()]):10.3f}{mean_gain:+8.3f}")

    onnx.save(proto, args.out / "espcn_x3.onnx")
    shutil.copyfile(data / SAMPLE, args.out / "sample.jpg")
    meta = {"scale": SCALE, "train": TRAIN, "held_out": HELD_OUT, "psnr_db": table,
            "mean_gain_db": round(mean_gain, 4), "trained_with": [cmd], "torch": torch.__version__,
            "stages": [{"steps": step, "train_seconds": round(train_s, 1),
                        "mean_gain_db": round(mean_gain, 4)}]}
    prev = args.init.parent / "espcn_x3.json" if args.init else None
    if prev and prev.is_file():  # a continued run: keep the earlier stages' record
        old = json.loads(prev.read_text())
        for k in ("trained_with", "stages"):
            meta[k] = ([old[k]] if isinstance(old.get(k), str) else old.get(k, [])) + meta[k]
    (args.out / "espcn_x3.json").write_text(json.dumps(meta, indent=2) + "\n")


def psnr_of(mse):
    return 10 * np.log10(1.0 / max(mse, 1e-12))


if __name__ == "__main__":
    main()
