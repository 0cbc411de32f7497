"""Multi-graph workloads as `npurun estimate` runs them by name: the graphs of a pipeline are
estimated one by one (npusim's per-graph model) and combined by how often the application
runs each.

* an LLM of the AI Hub table (llm.LLMS): the 1-token generator over the model's KV cache
  (decode: `tokens_per_s` = 1 / its latency) and the 128-token prompt processor (`ttft_ms`:
  time to the first token of a 128-token prompt);
* Whisper (`whisper_tiny`, `whisper_base`): one encoder pass per 30 s of audio plus
  `decode_tokens` decoder steps (200: AI Hub's benchmark length) -> `times_real_time`;
* Stable Diffusion 1.5 (`stable_diffusion_v1_5`): the text encoder twice (prompt and empty
  prompt, for classifier-free guidance), the UNet twice per step for `steps` steps, the VAE
  decoder once -> `seconds_per_image`, `images_per_j`.
Every count is an assumption of the pipeline, stated in its `assumptions` key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ...devices import Device
from ...errors import NpurunError
from ...util import atomic_write
from .simulate import Report, estimate
from .view import npusim_view

DEFAULT_PRECISION = {"llm": "w4a16", "whisper": "fp16", "sd": "w8a16"}


@dataclass
class PipelineReport:
    name: str
    kind: str
    parts: list[tuple[str, int, Report]]   # (component, runs per result, its report)
    figures: dict
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        main = self.parts[0][2].to_dict()
        d = {**main, "graph": self.name, "pipeline": self.kind, **self.figures,
             "assumptions": self.assumptions,
             "components": {c: {"runs": k, **r.to_dict()} for c, k, r in self.parts}}
        return d

    def summary(self) -> str:
        lines = [f"npusim pipeline estimate: {self.name} ({self.kind}) on {self.parts[0][2].device.name}"]
        for c, k, r in self.parts:
            lines.append(f"  {c:22s} x{k:<4d} {r.latency_s * 1e3:10.3f} ms  {r.macs / 1e9:9.2f} GMACs  "
                         f"{r.effective_tops:6.2f} TOPS  hit rate {r.fast_tier_hit_rate:.0%}  "
                         f"{r.energy_j * 1e3:9.2f} mJ  ({r.precision})")
        for k, v in self.figures.items():
            lines.append(f"  {k:22s} {v:.4g}" if isinstance(v, float) else f"  {k:22s} {v}")
        lines += [f"  assumes: {a}" for a in self.assumptions]
        return "\n".join(lines)

    def write_json(self, path) -> None:
        atomic_write(path, json.dumps(self.to_dict(), indent=2).encode())


def pipeline_kind(name: str) -> str | None:
    from ...zoo.architectures.llm import LLMS
    if name in LLMS:
        return "llm"
    if name in ("whisper_tiny", "whisper_base"):
        return "whisper"
    if name in ("stable_diffusion_v1_5", "sd15"):
        return "sd"
    return None


def _est(arch: str, dev: Device, precision: str) -> Report:
    from ...zoo.architectures import build
    return estimate(npusim_view(build(arch)), dev, {}, precision)


def run_pipeline(name: str, dev: Device, precision: str = "auto", steps: int = 20,
                 decode_tokens: int = 200) -> PipelineReport:
    kind = pipeline_kind(name)
    if kind is None:
        raise NpurunError(f"{name}: not a pipeline name")
    if steps < 1 or decode_tokens < 1:
        raise NpurunError(f"{name}: --steps and decode tokens must be >= 1, got {steps} / {decode_tokens}")
    prec = DEFAULT_PRECISION[kind] if precision == "auto" else precision
    if kind == "llm":
        from ...zoo.architectures.llm import LLMS
        model = name.removesuffix("_quantized")
        cfg = LLMS[model]
        tok, prompt = _est(f"{model}_token", dev, prec), _est(f"{model}_prompt", dev, prec)
        figures = {"tokens_per_s": 1 / tok.latency_s, "ttft_ms": prompt.latency_s * 1e3,
                   "context_length": cfg.context, "decode_j_per_token": tok.energy_j}
        return PipelineReport(name, kind, [("token generator", 1, tok), ("prompt processor (128)", 1, prompt)], figures,
                              [f"decode at a full static {cfg.context}-token KV cache (the graph reads all of it)",
                               "TTFT = one 128-token prompt pass (the table's ttft_min)",
                               f"configuration of {cfg.hf}"])
    if kind == "whisper":
        size = name.split("_")[1]
        enc, dec = _est(f"whisper_{size}_encoder", dev, prec), _est(f"whisper_{size}_decoder", dev, prec)
        total = enc.latency_s + decode_tokens * dec.latency_s
        energy = enc.energy_j + decode_tokens * dec.energy_j
        figures = {"seconds_per_30s_audio": total, "times_real_time": 30.0 / total,
                   "audio_s_per_j": 30.0 / energy, "latency_ms": total * 1e3, "energy_mj": energy * 1e3}
        return PipelineReport(name, kind, [("encoder", 1, enc), ("decoder step", decode_tokens, dec)], figures,
                              ["30 s of audio per encoder pass",
                               f"{decode_tokens} decoder steps per 30 s (AI Hub's benchmark decode length)"])
    te, unet, vae = _est("sd15_text_encoder", dev, prec), _est("sd15_unet", dev, prec), _est("sd15_vae_decoder", dev, prec)
    runs = [("text encoder", 2, te), ("unet", 2 * steps, unet), ("vae decoder", 1, vae)]
    total = sum(k * r.latency_s for _, k, r in runs)
    energy = sum(k * r.energy_j for _, k, r in runs)
    figures = {"steps": steps, "seconds_per_image": total, "images_per_s": 1 / total, "images_per_j": 1 / energy,
               "latency_ms": total * 1e3, "energy_mj": energy * 1e3}
    return PipelineReport(name, kind, runs, figures,
                          [f"{steps} denoising steps, classifier-free guidance: the UNet runs twice per step (batch 1, "
                           "as AI Hub's app does) and the text encoder twice", "512x512 output (64x64 latents)",
                           "energy: npusim's uncalibrated pJ/MAC and pJ/byte (relative, not absolute)"])


__all__ = ["PipelineReport", "pipeline_kind", "run_pipeline", "DEFAULT_PRECISION"]
