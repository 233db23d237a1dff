"""W4A8 accuracy: what FP8 activations cost against the W4A16 layer and against an fp32 reference (CPU).

Layer table: for MXFP4 and NVFP4 weights and each activation scheme (W4A16 = BF16 activations; W4A8 with static
per-tensor FP8 = kFp8StaticTensorSym, the scales calibrated on another batch of the same distribution as a checkpoint's
input_scale; W4A8 with dynamic MXFP8 = kMxfp8Dynamic), the output of `backends.emulation.moe_forward` with the W4A8
kernels' numerics: fake quantization (vLLM's, what backends.triton_moe computes on bf16 tensor cores and EMULATION
runs), and the FP8 dots' operands (fp8_operands=True, forced with w4a8_mma='fp8'), against

* the W4A16 layer (BF16 activations, the same quantized weights), and
* the fp32 reference (the same dequantized weights, unquantized fp32 activations),

as relative L2 error and max |error| / RMS(reference), on a gpt-oss-like and a DeepSeek-like small shape, with
Gaussian activations and with LLM-like outlier channels (a few hidden channels scaled x20-x100).

Logits table: tiny random GptOss (MXFP4 experts) and DeepSeek-V3 (NVFP4 experts) models of the real architectures
(tests/hf_tiny_models.py), experts patched with `backends.integrations.transformers.patch_model`, W4A16 vs W4A8
(dynamic MXFP8, kMxfp8Dynamic; static per-tensor FP8, kFp8StaticTensorSym, on the DeepSeek-V3 model, its ModelOpt
checkpoint given input_scale tensors calibrated on another batch): the kernels under Triton's interpreter
(TRITON_MOE / TRITON_MOE_W4A8), and EMULATION (FP8 fake-quantized activations, vLLM's emulation numerics), which the
rules pick for an FP8 question without the kernels.

    python benchmarks/w4a8_accuracy.py [OUT_DIR]    # default benchmarks/results/w4a8-accuracy
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from backends import emulation, formats  # noqa: E402

#: name -> (experts, hidden, intermediate, top_k, activation, gate_up): the real layers' proportions, CPU-sized
SHAPES = {
    "gpt-oss-like": (16, 768, 768, 4, "swigluoai", "interleaved"),       # gpt-oss-120b: 128 x 2880 x 2880, top 4
    "deepseek-like": (32, 896, 256, 8, "silu", "contiguous"),            # DeepSeek-V3: 256 x 7168 x 2048, top 8
}
#: (scheme, numerics): "fake-quant" = FP8 fake-quantized inputs on exact fp32 weights (vLLM's emulation: what the
#: W4A8 kernels compute on bf16 tensor cores, and EMULATION for an FP8 question); "fp8 dots" = the operands of the
#: forced FP8 dots (fp8_operands=True: weights rebased per row to E4M3, MXFP8 rows rebased to one power of two): the
#: gap between the two is what those operands cost
VARIANTS = (("w4a16", "bf16"), ("fp8_per_tensor_static", "fake-quant"), ("mxfp8", "fake-quant"),
            ("fp8_per_tensor_static", "fp8 dots"), ("mxfp8", "fp8 dots"))
ACTIVATION_KEYS = {"fp8_per_tensor_static": "kFp8StaticTensorSym", "mxfp8": "kMxfp8Dynamic"}
OUTLIER_FACTORS = (20.0, 40.0, 70.0, 100.0)
TOKENS = 256


def activations(tokens: int, hidden: int, outliers: bool, gen: torch.Generator,
                channels: torch.Tensor) -> torch.Tensor:
    x = torch.randn(tokens, hidden, generator=gen)
    if outliers:
        x[:, channels] *= torch.tensor(OUTLIER_FACTORS)
    return x.to(torch.bfloat16)


def quantized_layer(fmt: str, experts: int, hidden: int, inter: int, gen: torch.Generator) -> dict:
    """emulation.moe_forward's weight arguments for a random layer quantized to `fmt`."""
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
    if fmt == "mxfp4":
        (q13, s13), (q2, s2) = formats.quantize_mxfp4(w13), formats.quantize_mxfp4(w2)
        return dict(format="mxfp4", w13=q13, w13_scale=s13, w2=q2, w2_scale=s2)
    q13, s13, g13 = formats.quantize_nvfp4(w13, (448 * 6 / w13.abs().amax(dim=(1, 2))).float())
    q2, s2, g2 = formats.quantize_nvfp4(w2, (448 * 6 / w2.abs().amax(dim=(1, 2))).float())
    return dict(format="nvfp4", w13=q13, w13_scale=s13, w2=q2, w2_scale=s2, w13_global_scale=g13,
                w2_global_scale=g2)


def static_scales(x: torch.Tensor, layer: dict, logits: torch.Tensor, top_k: int, activation: str,
                  gate_up: str) -> dict:
    """Per-tensor FP8 input scales (amax / 448) of both GEMM inputs on a calibration batch, as a static-FP8
    checkpoint's input_scale: GEMM2's input is act(x W13^T) of every routed (token, expert) pair."""
    xf = x.float()
    ids, _ = emulation._route(logits, None, None, top_k, True, x.shape[0], layer["w13"].shape[0], x.device)
    amax2 = torch.zeros((), device=x.device)
    for expert in ids.unique().tolist():
        rows = (ids == expert).any(dim=1)
        w13 = emulation._dequantize_expert(layer["format"], layer["w13"], layer["w13_scale"],
                                           layer.get("w13_global_scale"), expert)
        h = emulation._activate(xf[rows] @ w13.T, activation, gate_up, 1.702, 1.0, 7.0)
        amax2 = torch.maximum(amax2, h.abs().amax())
    return dict(a1_scale=(xf.abs().amax() / 448).reshape(1), a2_scale=(amax2 / 448).reshape(1))


def errors(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative L2, max |y - ref| / RMS(ref))."""
    diff = y.float() - ref.float()
    rms = ref.float().pow(2).mean().sqrt().clamp_min(1e-30)
    return float(diff.norm() / ref.float().norm().clamp_min(1e-30)), float(diff.abs().max() / rms)


def layer_rows() -> list[dict]:
    rows = []
    for shape, (experts, hidden, inter, top_k, activation, gate_up) in SHAPES.items():
        for fmt in ("mxfp4", "nvfp4"):
            gen = torch.Generator().manual_seed(0)
            layer = quantized_layer(fmt, experts, hidden, inter, gen)
            channels = torch.randperm(hidden, generator=gen)[:len(OUTLIER_FACTORS)]
            call = dict(top_k=top_k, renormalize=True, activation=activation, gate_up_layout=gate_up)
            for outliers in (False, True):
                calib = activations(TOKENS, hidden, outliers, gen, channels)
                x = activations(TOKENS, hidden, outliers, gen, channels)
                logits = torch.randn(TOKENS, experts, generator=gen)
                calib_logits = torch.randn(TOKENS, experts, generator=gen)
                ref = emulation.moe_forward(x.float(), **layer, router_logits=logits, **call)
                w4a16 = emulation.moe_forward(x, **layer, router_logits=logits, **call)
                scales = static_scales(calib, layer, calib_logits, top_k, activation, gate_up)
                for scheme, numerics in VARIANTS:
                    if scheme == "w4a16":
                        y = w4a16
                    else:
                        extra = scales if scheme == "fp8_per_tensor_static" else {}
                        y = emulation.moe_forward(x, **layer, router_logits=logits, **call,
                                                  gemm_input_schemes=(scheme, scheme),
                                                  fp8_operands=numerics == "fp8 dots", **extra)
                    for against, reference in (("fp32", ref), ("w4a16", w4a16)):
                        if scheme == "w4a16" and against == "w4a16":
                            continue
                        rel, peak = errors(y, reference)
                        rows.append(dict(shape=shape, format=fmt, activations="outliers" if outliers else "normal",
                                         scheme=scheme, numerics=numerics, against=against, rel_l2=f"{rel:.3e}",
                                         max_abs_over_rms=f"{peak:.3e}", tokens=TOKENS,
                                         layer=f"E{experts} H{hidden} I{inter} top{top_k} {activation}"))
    return rows


def logits_rows() -> list[dict]:
    """The logits table, from a TRITON_INTERPRET=1 worker (Triton fixes interpreted vs compiled at import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, __file__, "--logits-worker"], env=env, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode:
        raise RuntimeError(f"logits worker failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


#: (scheme, activation key, run the kernels under the interpreter): the rules then pick TRITON_MOE (W4A16) and
#: TRITON_MOE_W4A8; without the interpreter an FP8 question gets EMULATION (FP8 fake-quant on exact weights).
#: Static FP8 reads the checkpoint's input_scale, which the ModelOpt layout carries and OpenAI's gpt-oss MXFP4
#: layout does not: only the DeepSeek-V3 model gets those rows.
LOGITS_VARIANTS = (("w4a16", None, True), ("mxfp8", "kMxfp8Dynamic", True), ("mxfp8", "kMxfp8Dynamic", False),
                   ("fp8_per_tensor_static", "kFp8StaticTensorSym", True),
                   ("fp8_per_tensor_static", "kFp8StaticTensorSym", False))


def _with_calibrated_input_scales(model, checkpoint: Path, directory: Path, ids: torch.Tensor) -> Path:
    """`checkpoint` plus ModelOpt input_scale tensors calibrated on `ids` as a static-FP8 checkpoint's are: per
    layer, amax / 448 of the experts' input (gate and up) and of act(gate) * up over the routed pairs (down), the
    same for every expert (the kernels take the max over experts anyway)."""
    from hf_tiny_models import moe_experts
    from safetensors.torch import load_file

    from backends.checkpoints import write_checkpoint

    calls: dict[int, list] = {}
    experts_of = moe_experts(model)
    hooks = [experts.register_forward_pre_hook(lambda _, args, n=n: calls.setdefault(n, []).append(args[:2]))
             for n, experts in experts_of.items()]
    try:
        model(input_ids=ids)
    finally:
        for hook in hooks:
            hook.remove()
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(checkpoint / shard)))
    for n, experts in experts_of.items():
        amax_in, amax_mid = torch.zeros(()), torch.zeros(())
        for x, top_k_index in calls[n]:
            amax_in = torch.maximum(amax_in, x.float().abs().amax())
            for expert in top_k_index.unique().tolist():
                rows = (top_k_index == expert).any(dim=-1)
                gate, up = (x[rows].float() @ experts.gate_up_proj[expert].float().T).chunk(2, dim=-1)
                amax_mid = torch.maximum(amax_mid, (experts.act_fn(gate) * up).abs().amax())
        for expert in range(experts.num_experts):
            prefix = f"model.layers.{n}.mlp.experts.{expert}."
            for proj, amax in (("gate_proj", amax_in), ("up_proj", amax_in), ("down_proj", amax_mid)):
                tensors[prefix + proj + ".input_scale"] = (amax / 448).reshape(())
    config = json.loads((checkpoint / "config.json").read_text())
    return write_checkpoint(directory, tensors, config=config, shards=3)


@torch.no_grad()
def _logits_worker() -> None:
    from hf_tiny_models import quantized_model

    from backends.checkpoints import gpt_oss, modelopt
    from backends.integrations.transformers import patch_model

    sizes = dict(seed=0, hidden=128, inter=64, experts=8, top_k=2, layers=2)
    for model_type, layout, fmt in (("gpt_oss", gpt_oss.LAYOUT, "mxfp4"), ("deepseek_v3", modelopt.LAYOUT, "nvfp4")):
        with tempfile.TemporaryDirectory() as ref_dir, tempfile.TemporaryDirectory() as tmp, \
                tempfile.TemporaryDirectory() as static_dir:
            reference, _ = quantized_model(model_type, layout, Path(ref_dir), **sizes)  # fp32, dequantized experts
            bf16, _ = quantized_model(model_type, layout, Path(tmp), dtype=torch.bfloat16, **sizes)  # the kernels'
            ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
            ref = reference(input_ids=ids).logits.float()
            if layout == modelopt.LAYOUT:  # another batch calibrates the static scales
                calibration = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
                _with_calibrated_input_scales(reference, Path(tmp), Path(static_dir), calibration)
            outputs = {}
            for scheme, key, interpret in LOGITS_VARIANTS:
                if scheme == "fp8_per_tensor_static" and layout != modelopt.LAYOUT:
                    continue
                model = copy.deepcopy(bf16)
                kwargs = {"profile": "moe-oracle", "platform": {"kind": "cpu"}, "activation_key": key,
                          "packages": {"triton": interpret}, "env": {"TRITON_INTERPRET": "1"} if interpret else {}}
                checkpoint = static_dir if scheme == "fp8_per_tensor_static" else tmp
                layers = patch_model(model, checkpoint, layer_kwargs=kwargs)
                backend = "+".join(sorted({layer.decision.backend for layer in layers.values()}))
                outputs[(scheme, backend)] = model(input_ids=ids).logits.float()
            w4a16 = outputs[("w4a16", "TRITON_MOE")]
            for (scheme, backend), y in outputs.items():
                for against, reference_logits in (("fp32", ref), ("w4a16", w4a16)):
                    if scheme == "w4a16" and against == "w4a16":
                        continue
                    rel, peak = errors(y, reference_logits)
                    top1 = float((y.argmax(-1) == reference_logits.argmax(-1)).float().mean())
                    print(json.dumps(dict(model=model_type, format=fmt, scheme=scheme, backend=backend,
                                          against=against, rel_l2=f"{rel:.3e}", max_abs_over_rms=f"{peak:.3e}",
                                          top1_agreement=f"{top1:.4f}")), flush=True)


def write(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(layer: list[dict], logits: list[dict]) -> str:
    lines = ["# W4A8 accuracy (CPU, backends.emulation)", "",
             "`fake-quant`: FP8 fake-quantized inputs on exact weights (vLLM's emulation numerics: what the W4A8 "
             "kernels compute on bf16 tensor cores, and the EMULATION backend for an FP8 question); `fp8 dots`: the "
             "operands of the FP8 dots that `w4a8_mma='fp8'` forces (emulation fp8_operands=True).", "",
             f"{TOKENS} tokens; rel L2 = ||y - ref|| / ||ref||, peak = max |y - ref| / RMS(ref). "
             "`outliers`: 4 hidden channels scaled x20, x40, x70, x100. Static FP8 scales calibrated on another batch.",
             "", "| shape | format | activations | scheme | vs fp32: rel L2 | vs fp32: peak | vs W4A16: rel L2 | "
             "vs W4A16: peak |", "|---|---|---|---|---|---|---|---|"]
    keyed = {(r["shape"], r["format"], r["activations"], r["scheme"], r["numerics"], r["against"]): r for r in layer}
    for (shape, fmt, acts, scheme, numerics, against), r in keyed.items():
        if against != "fp32":
            continue
        other = keyed.get((shape, fmt, acts, scheme, numerics, "w4a16"))
        vs16 = (other["rel_l2"], other["max_abs_over_rms"]) if other else ("—", "—")
        name = scheme if scheme == "w4a16" else f"w4a8 {scheme} ({ACTIVATION_KEYS[scheme]}), {numerics}"
        lines.append(f"| {shape} | {fmt} | {acts} | {name} | {r['rel_l2']} | {r['max_abs_over_rms']} | {vs16[0]} | "
                     f"{vs16[1]} |")
    lines += ["", "## Logits of tiny real-architecture models (2 x 24 tokens, vocabulary 128)", "",
              "bf16 models with their experts patched (`patch_model`); TRITON_MOE / TRITON_MOE_W4A8 are the kernels "
              "under Triton's interpreter, EMULATION the FP8 fake-quant the rules give an FP8 question without FP8 "
              "tensor cores; `fp32` = the fp32 model with the dequantized experts. Static FP8 "
              "(fp8_per_tensor_static) on DeepSeek-V3 only: its ModelOpt checkpoint carries input_scale (here "
              "calibrated on another batch, amax / 448), OpenAI's gpt-oss MXFP4 layout has none.", "",
              "| model | experts | scheme | backend (CPU) | against | rel L2 | peak | top-1 agreement |",
              "|---|---|---|---|---|---|---|---|"]
    for r in logits:
        lines.append(f"| {r['model']} | {r['format']} | {r['scheme']} | {r['backend']} | {r['against']} | "
                     f"{r['rel_l2']} | {r['max_abs_over_rms']} | {r['top1_agreement']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(ROOT / "benchmarks" / "results" / "w4a8-accuracy"))
    parser.add_argument("--skip-logits", action="store_true", help="the layer table only")
    parser.add_argument("--logits-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.logits_worker:
        _logits_worker()
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    layer = layer_rows()
    write(layer, out / "accuracy.csv")
    logits = [] if args.skip_logits else logits_rows()
    if logits:
        write(logits, out / "logits.csv")
    (out / "accuracy.md").write_text(markdown(layer, logits))
    print((out / "accuracy.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
