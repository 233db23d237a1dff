"""Decode step time per token of transformers models, unpatched bf16 experts vs this project's MoELayer kernels.

For gpt-oss, Qwen3-MoE and DeepSeek-V3 at their real expert sizes (a few layers, small attention, vocab 32000;
DeepSeek-V3 with fewer routed experts so that its fp32 initialisation fits one GPU): random experts quantized
into the released layout (gpt-oss MXFP4, ModelOpt NVFP4), written as a sharded safetensors checkpoint, loaded
back through `backends.checkpoints`, and the model patched with `backends.integrations.transformers.patch_model`.
The reference is the same model with the dequantized experts in bf16, run by transformers itself.

Per model and batch size: greedy `generate` of 1 and of 1 + N tokens after a 32-token prompt (CUDA synchronised,
eager, no CUDA graphs: transformers' default path), repeated; decode time per token = (t(1+N) - t(1)) / N, the
median over repeats. Also: the backend the oracle chose, the first 16 greedy tokens' agreement and the largest
logit difference per prompt position relative to the logits' max (largest and median position: a bf16
routing flip moves one position far; the kernels compute from the exact quantized weights, the bf16 reference
from their bf16 rounding).

    python benchmarks/gpu_transformers_decode.py OUT_DIR [--steps 64] [--repeats 5]

Writes OUT_DIR/transformers_decode_<model>.csv (one row per batch) as soon as a model is done, so a run cut short
keeps what it measured; `--models` runs a subset (e.g. one model per call).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # hf_tiny_models: the tests' model builder, same code path

from hf_tiny_models import quantized_model  # noqa: E402

from backends.checkpoints import gpt_oss, modelopt  # noqa: E402
from backends.integrations.transformers import patch_model  # noqa: E402

#: name -> (model_type, layout, sizes) with the release's expert sizes
MODELS = {
    "gpt-oss-20b-experts": ("gpt_oss", gpt_oss.LAYOUT,
                            dict(hidden=2880, inter=2880, experts=32, top_k=4, layers=4, vocab=32000)),
    "qwen3-30b-a3b-experts": ("qwen3_moe", modelopt.LAYOUT,
                              dict(hidden=2048, inter=768, experts=128, top_k=8, layers=4, vocab=32000)),
    "deepseek-v3-experts-E64": ("deepseek_v3", modelopt.LAYOUT,
                                dict(hidden=7168, inter=2048, experts=64, top_k=8, layers=3, vocab=32000, n_group=8,
                                     topk_group=4)),
}
PROMPT = 32


TINY = dict(hidden=64, inter=32, experts=8, top_k=2, layers=2, vocab=128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate_seconds(model, prompt, new_tokens: int) -> float:
    _sync(prompt.device)
    start = time.perf_counter()
    model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    _sync(prompt.device)
    return time.perf_counter() - start


def decode_ms_per_token(model, prompt, steps: int, repeats: int) -> tuple[float, float]:
    """(median, min) ms per decode step over `repeats` measurements."""
    _generate_seconds(model, prompt, 4)  # warm-up: kernels compiled, caches allocated
    times = []
    for _ in range(repeats):
        one = _generate_seconds(model, prompt, 1)
        many = _generate_seconds(model, prompt, 1 + steps)
        times.append((many - one) / steps * 1e3)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small sizes: a smoke test of the script (CPU)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers

    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for name in args.models:
        rows = []
        model_type, layout, sizes = MODELS[name]
        if args.tiny:
            sizes = dict(TINY, **({"n_group": 2, "topk_group": 1} if model_type == "deepseek_v3" else {}))
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            reference, _ = quantized_model(model_type, layout, Path(tmp) / "ckpt", dtype=torch.bfloat16, device=device,
                                           **sizes)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            patched = copy.deepcopy(reference)
            layers = patch_model(patched, Path(tmp) / "ckpt")
            patch_s = time.perf_counter() - t0
        backends = sorted({f"{lay.decision.backend}/{lay.decision.kernel}" for lay in layers.values()})
        expert_bytes = sum(p.numel() * p.element_size() for n, p in reference.named_parameters() if ".experts." in n)
        for batch in args.batches:
            prompt = torch.randint(0, sizes["vocab"], (batch, PROMPT), device=device,
                                   generator=torch.Generator(device).manual_seed(batch))
            with torch.no_grad():
                ref_logits, got_logits = reference(prompt).logits.float(), patched(prompt).logits.float()
            per_position = (ref_logits - got_logits).abs().amax(-1) / ref_logits.abs().max()  # a routing flip in
            rel_max, rel_median = float(per_position.max()), float(per_position.median())  # bf16 moves one position
            ref_tokens = reference.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)[:, PROMPT:]
            got_tokens = patched.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)[:, PROMPT:]
            agree = float((ref_tokens == got_tokens).float().mean())
            ref_ms, ref_min = decode_ms_per_token(reference, prompt, args.steps, args.repeats)
            got_ms, got_min = decode_ms_per_token(patched, prompt, args.steps, args.repeats)
            row = {"gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__, "model": name,
                   "model_type": model_type, "layout": layout, **{k: sizes[k] for k in ("hidden", "inter", "experts",
                                                                                       "top_k", "layers")},
                   "moe_layers": len(layers), "bf16_expert_MiB": round(expert_bytes / 2**20), "batch": batch,
                   "prompt": PROMPT, "steps": args.steps, "repeats": args.repeats,
                   "bf16_ms_per_token": round(ref_ms, 3), "bf16_ms_min": round(ref_min, 3),
                   "moelayer_ms_per_token": round(got_ms, 3), "moelayer_ms_min": round(got_min, 3),
                   "speedup": round(ref_ms / got_ms, 3), "backend": " ".join(backends),
                   "greedy16_agreement": round(agree, 4), "prompt_logits_rel_diff_max": f"{rel_max:.3e}",
                   "prompt_logits_rel_diff_median": f"{rel_median:.3e}",
                   "build_s": round(build_s, 1), "load_and_patch_s": round(patch_s, 1)}
            rows.append(row)
            print(row, flush=True)
        del reference, patched, layers
        if device.type == "cuda":
            torch.cuda.empty_cache()
        path = args.out / f"transformers_decode_{name}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
