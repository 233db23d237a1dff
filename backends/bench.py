"""`moe-oracle bench`: time, on this GPU, every backend the rules could select here that this project can run.

    layer_shape(E, k, H, I, format, activation)      the layer (flags, or a model config parsed elsewhere)
    plan(shape, profile=..., also=...)                 which backends each profile could select here (forcing each
                                                       moe_backend string in turn), which of them have a runner;
                                                       torch-free questions only, so it runs (and is tested) on CPU
    run(shape, plan, tokens)                           GPU: one random checkpoint; per runnable backend a MoELayer
                                                       forced to it (as moe_backend= forcing does), its output checked
                                                       against the emulation on a few tokens (a failure is reported,
                                                       not timed), then timed per T by backends.gpu_timing (CUDA
                                                       graph, L2 flushed, median; eager where the code syncs)
    render / write_csv / write_overrides               one table (µs, fraction of the same-run memory floor, ratio to
                                                       the profile's default pick), a CSV, a deployment-overrides file
                                                       pinning the fastest backend of the profile

Every refusal is a BenchError naming the argument or backend and the fix; nothing is written until the run is done.
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from oracle import OracleError, default_oracle

__all__ = ["BenchError", "Candidate", "LayerShape", "Row", "layer_shape", "parse_shape", "parse_tokens", "plan",
           "render", "run", "write_csv", "write_overrides"]

#: ||y - emulation|| / ||emulation|| a backend must meet on the check tokens before it is timed: the W4A16 bound of
#: tests/tolerances.py ("w4a16_moe_rel_l2": two bf16 roundings, ~2.4e-3, with 4x headroom); a wrong scale, clamp,
#: bias or gate/up split gives > 1e-1.
CHECK_REL_L2 = 1e-2
FORMATS = ("mxfp4", "nvfp4")
BLOCK = {"mxfp4": 32, "nvfp4": 16}
DEFAULT_TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
#: an eagerly timed call slower than this is not timed at larger T (the emulation at prefill sizes)
EAGER_BUDGET_S = 2.0


class BenchError(Exception):
    """Bad bench input, or nothing to time here; the message names the argument or backend and the fix."""


@dataclass(frozen=True)
class LayerShape:
    """One MoE layer to time: sizes, weight format, gated activation, gate/up row order, biases."""

    experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    format: str
    activation: str
    gate_up: str
    biases: bool
    name: str

    def describe(self) -> str:
        return (f"{self.name}: {self.format}, E={self.experts}, top_k={self.top_k}, H={self.hidden_size}, "
                f"I={self.intermediate_size}, {self.activation} ({self.gate_up} gate/up"
                f"{', biases' if self.biases else ''})")


def layer_shape(experts: int, top_k: int, hidden_size: int, intermediate_size: int, format: str, activation: str,
                *, gate_up: str | None = None, biases: bool | None = None, name: str | None = None) -> LayerShape:
    """A checked LayerShape. gate_up / biases default to the gpt-oss convention for swigluoai (interleaved rows,
    biases) and to the generic one otherwise ([w1; w3], no biases). A model-config parser calls this too."""
    from oracle.vocabulary import GATED_ACTIVATIONS

    sizes = {"E": experts, "top_k": top_k, "H": hidden_size, "I": intermediate_size}
    for label, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BenchError(f"--shape: {label}={value!r} must be a positive integer")
    if format not in FORMATS:
        raise BenchError(f"--format {format!r}: must be one of {', '.join(FORMATS)}")
    if top_k > experts:
        raise BenchError(f"--shape: top_k={top_k} exceeds the E={experts} experts; give E,k,H,I in that order")
    for label, value in (("H", hidden_size), ("I", intermediate_size)):
        if value % BLOCK[format]:
            raise BenchError(f"--shape: {label}={value} must be a multiple of {BLOCK[format]} (the {format} block "
                             f"size along K)")
    if activation not in GATED_ACTIVATIONS:
        raise BenchError(f"--activation {activation!r}: must be a gated activation, one of "
                         f"{', '.join(GATED_ACTIVATIONS)}")
    gpt_oss = activation == "swigluoai"
    gate_up = gate_up or ("interleaved" if gpt_oss else "contiguous")
    if gate_up not in ("interleaved", "contiguous"):
        raise BenchError(f"--gate-up {gate_up!r}: must be interleaved (gpt-oss) or contiguous ([w1; w3])")
    biases = gpt_oss if biases is None else biases
    name = name or f"E{experts}-k{top_k}-H{hidden_size}-I{intermediate_size}-{format}"
    return LayerShape(experts, top_k, hidden_size, intermediate_size, format, activation, gate_up, biases, name)


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """'E,k,H,I' -> four ints, or BenchError naming --shape."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise BenchError(f"--shape {text!r}: give four positive integers E,k,H,I (experts, experts per token, hidden "
                         f"size, intermediate size), e.g. --shape 128,4,2880,2880")
    e, k, h, i = (int(p) for p in parts)
    return e, k, h, i


def parse_tokens(text: str) -> list[int]:
    """'1,37,1000' -> [1, 37, 1000], or BenchError naming --tokens."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise BenchError(f"--tokens {text!r}: give a comma-separated list of positive token counts, e.g. 1,37,1000")
    return list(dict.fromkeys(int(p) for p in parts))


# ---------------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Candidate:
    """A backend some profile could select here: runnable (runner set), or why it is not timed."""

    profile: str
    backend: str
    moe_backend: str  # the explicit string that forces it ("auto" for the default pick)
    runner: str | None
    default: bool  # the chosen profile's pick with moe_backend=auto
    not_timed: str | None = None  # why not: no runner, quantized activations, ...


def _meta_weights(shape: LayerShape) -> Any:
    """A MoEWeights of the shape's sizes on the meta device: the layer's question without allocating weights."""
    from backends.weights import MoEWeights

    e, h, i, block = shape.experts, shape.hidden_size, shape.intermediate_size, BLOCK[shape.format]
    scale = torch.uint8 if shape.format == "mxfp4" else torch.float8_e4m3fn
    meta = {"device": "meta"}
    fields: dict[str, Any] = {
        "w13": torch.empty(e, 2 * i, h // 2, dtype=torch.uint8, **meta),
        "w13_scale": torch.empty(e, 2 * i, h // block, dtype=scale, **meta),
        "w2": torch.empty(e, h, i // 2, dtype=torch.uint8, **meta),
        "w2_scale": torch.empty(e, h, i // block, dtype=scale, **meta)}
    if shape.format == "nvfp4":
        fields["w13_global_scale"] = torch.empty(e, **meta)
        fields["w2_global_scale"] = torch.empty(e, **meta)
    if shape.biases:
        fields["w13_bias"] = torch.empty(e, 2 * i, **meta)
        fields["w2_bias"] = torch.empty(e, h, **meta)
    return MoEWeights(format=shape.format, gate_up=shape.gate_up, **fields)


def plan(shape: LayerShape, *, profile: str = "vllm-0.33", also: Sequence[str] = ("moe-oracle",),
         policy: str | None = None, platform: dict | None = None, packages: dict | None = None,
         env: dict | None = None, oracle: Any = None) -> list[Candidate]:
    """The backends `profile` (then each of `also`) could select for this layer here: its default pick, then every
    backend an explicit moe_backend string selects (first string wins per backend). A backend already listed by an
    earlier profile is not repeated. platform / packages / env: the question's (default: detected here)."""
    from backends import layer as layer_module

    oracle = oracle or default_oracle()
    weights = _meta_weights(shape)
    if platform is None:
        platform = layer_module.platform_for_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    found: list[Candidate] = []
    seen: set[str] = set()
    for index, name in enumerate(dict.fromkeys([profile, *also])):
        try:
            table = oracle.table(name)
        except OracleError as exc:
            flag = "--profile" if index == 0 else "--also"
            raise BenchError(f"{flag} {name!r}: {exc}") from None
        pol = policy or shape.format
        if pol not in table.policies:
            raise BenchError(f"--policy {pol!r}: profile {name} has no such policy; it has "
                             f"{', '.join(table.policies)}")
        family = table.policies[pol].family
        for key in ("auto", *family.explicit):
            question = layer_module._question(
                oracle, profile=name, policy=pol, platform=platform, packages=packages, env=env, weights=weights,
                activation=shape.activation, top_k=shape.top_k, renormalize=True, moe_backend=key)
            try:
                decision = oracle.select(oracle.prepare(question))
            except OracleError as exc:
                raise BenchError(f"profile {name}, moe_backend={key!r}: the question is malformed: {exc}") from None
            if decision.outcome != "selected" or decision.backend is None or decision.backend in seen:
                continue
            seen.add(decision.backend)
            why = None
            if decision.runner is None:
                why = decision.missing_why or "no runner in this project"
            elif decision.activation_key is not None:
                why = f"quantizes activations ({decision.activation_key}); a MoELayer runs W4A16"
            found.append(Candidate(name, decision.backend, key, decision.runner, index == 0 and key == "auto", why))
    return found


# ---------------------------------------------------------------------------------------------------- the run
@dataclass
class Row:
    """One backend at one T (or the backend's check / refusal when it is not timed: tokens None)."""

    profile: str
    backend: str
    tokens: int | None
    us: float | None = None
    floor_us: float | None = None
    method: str = ""
    rel_l2: float | None = None
    default: bool = False
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def floor_fraction(self) -> float | None:
        return None if self.us is None or self.floor_us is None else self.floor_us / self.us


def require_cuda() -> str:
    """The GPU's name, or BenchError: timing kernels needs one."""
    if not torch.cuda.is_available():
        raise BenchError("timing kernels needs a CUDA GPU and torch sees none here (torch.cuda.is_available() is "
                         "False); run it on a GPU machine with a CUDA build of torch. `moe-oracle select` and "
                         "`explain` answer the selection question without a GPU")
    return torch.cuda.get_device_name()


def random_weights(shape: LayerShape, device: str = "cuda", seed: int = 0) -> Any:
    """A random checkpoint of the shape (every FP4 code, realistic scales; backends.triton_moe.testing)."""
    from backends.triton_moe.testing import Shape, random_checkpoint
    from backends.weights import MoEWeights

    spec = Shape(shape.name, shape.format, shape.experts, shape.top_k, shape.hidden_size, shape.intermediate_size,
                 shape.activation, shape.biases)
    g = torch.Generator(device=device).manual_seed(seed)
    ckpt = random_checkpoint(spec, device=device, generator=g, gate_up_layout=shape.gate_up)
    return MoEWeights(format=ckpt.pop("format"), gate_up=ckpt.pop("gate_up_layout"), **ckpt)


class Progress:
    """One status line on stderr, rewritten in place: [####......] done/total what."""

    def __init__(self, total: int, enabled: bool = True, stream: Any = None):
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            filled = int(30 * self.done / self.total)
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {what:<40.40}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def run(shape: LayerShape, candidates: Sequence[Candidate], tokens: Sequence[int], *, policy: str | None = None,
        iters: int = 30, check_tokens: int = 8, progress: bool = True, seed: int = 0,
        log: Callable[[str], None] = print) -> tuple[list[Row], dict]:
    """Check, then time, every runnable candidate on this GPU. Returns (rows, run facts: gpu, bandwidth, ...)."""
    from backends import LayerUnavailableError, MoELayer, emulation, gpu_timing

    gpu = require_cuda()
    bandwidth, copy, read, matmul = gpu_timing.measure_ceilings()
    facts = {"gpu": gpu, "bandwidth_gbs": bandwidth, "copy_gbs": copy, "read_gbs": read, "matmul_tflops": matmul,
             "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    log(f"# {gpu}: bandwidth {bandwidth:.0f} GB/s (copy {copy:.0f}, read-only {read:.0f}); bf16 matmul "
        f"{matmul:.1f} TFLOP/s")
    weights = random_weights(shape, seed=seed)
    flush = gpu_timing.Flusher()
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    inputs = {t: (torch.randn(t, shape.hidden_size, device="cuda", generator=g).bfloat16(),
                  torch.randn(t, shape.experts, device="cuda", generator=g)) for t in tokens}
    x_check, logits_check = (torch.randn(check_tokens, shape.hidden_size, device="cuda", generator=g).bfloat16(),
                             torch.randn(check_tokens, shape.experts, device="cuda", generator=g))
    swiglu = {"swiglu_alpha": 1.702, "swiglu_beta": 1.0, "swiglu_limit": 7.0} if shape.activation == "swigluoai" else {}
    reference = emulation.moe_forward(x_check.float(), **weights.emulation_kwargs(), router_logits=logits_check,
                                      top_k=shape.top_k, activation=shape.activation, **swiglu)
    one_expert = gpu_timing.expert_bytes(shape.format, shape.hidden_size, shape.intermediate_size)
    floors = {t: torch.topk(logits, shape.top_k, dim=-1).indices.unique().numel() * one_expert / (bandwidth * 1e3)
              for t, (_, logits) in inputs.items()}
    rows: list[Row] = []
    runnable = [c for c in candidates if c.not_timed is None]
    bar = Progress(len(runnable) * (1 + len(tokens)), enabled=progress)
    for c in candidates:
        if c.not_timed is not None:
            rows.append(Row(c.profile, c.backend, None, default=c.default, note=f"not timed: {c.not_timed}"))
            continue
        bar.step(f"{c.backend}: build and check")
        try:
            layer = MoELayer.from_checkpoint(weights, activation=shape.activation, top_k=shape.top_k,
                                             profile=c.profile, policy=policy or shape.format,
                                             moe_backend=c.moe_backend, device="cuda")
        except LayerUnavailableError as exc:
            rows.append(Row(c.profile, c.backend, None, default=c.default, note=f"not runnable here: {exc}"))
            bar.done += len(tokens)
            continue
        if layer.decision.backend != c.backend:  # forcing must give what the plan saw; never time a stand-in
            rows.append(Row(c.profile, c.backend, None, default=c.default,
                            note=f"not timed: forcing {c.moe_backend!r} built {layer.decision.backend}"))
            bar.done += len(tokens)
            continue
        try:
            out = layer.forward(x_check, logits_check).float()
            rel = float((out - reference).norm() / reference.norm().clamp_min(1e-30))
        except Exception as exc:  # noqa: BLE001  a library's failure is this backend's result, reported
            rows.append(Row(c.profile, c.backend, None, default=c.default,
                            note=f"failed the check: {type(exc).__name__}: {str(exc)[:300]}"))
            bar.done += len(tokens)
            continue
        if not math.isfinite(rel) or rel > CHECK_REL_L2:
            rows.append(Row(c.profile, c.backend, None, rel_l2=rel, default=c.default,
                            note=f"failed the check: rel. L2 error {rel:.3g} vs the emulation > {CHECK_REL_L2}"))
            bar.done += len(tokens)
            continue
        too_slow = False
        for t in tokens:
            bar.step(f"{c.backend}: T={t}")
            x, logits = inputs[t]
            row = Row(c.profile, c.backend, t, floor_us=floors[t], rel_l2=rel, default=c.default)
            if too_slow:
                row.note = f"not timed: an eager call took > {EAGER_BUDGET_S:.0f} s at a smaller T"
                rows.append(row)
                continue
            call = _layer_call(layer, x, logits)
            try:
                row.us, row.method = gpu_timing.time_graph(call, flush, iters), "cuda graph"
            except Exception as graph_exc:  # noqa: BLE001  code that syncs with the host cannot be captured
                torch.cuda.synchronize()
                started = time.perf_counter()
                try:
                    call()
                    torch.cuda.synchronize()
                    once = time.perf_counter() - started
                    row.us = gpu_timing.time_eager(call, flush, 3 if once > 0.05 else max(3, iters // 3))
                    row.method = "eager"
                    row.note = f"eager: not capturable in a CUDA graph ({type(graph_exc).__name__})"
                    too_slow = once > EAGER_BUDGET_S
                except Exception as exc:  # noqa: BLE001
                    row.note = f"failed at T={t}: {type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
        del layer
        torch.cuda.empty_cache()
    bar.close()
    return rows, facts


def _layer_call(layer: Any, x: torch.Tensor, logits: torch.Tensor) -> Callable[[], Any]:
    return lambda: layer.forward(x, logits)


# ---------------------------------------------------------------------------------------------------- output
def _default_us(rows: Sequence[Row]) -> dict[int, float]:
    return {r.tokens: r.us for r in rows if r.default and r.tokens is not None and r.us is not None}


def render(shape: LayerShape, rows: Sequence[Row], facts: dict, tokens: Sequence[int]) -> str:
    """The side-by-side table: per backend and T, µs / fraction of the memory floor / ratio to the default pick."""
    default = _default_us(rows)
    backends = list(dict.fromkeys((r.profile, r.backend, r.default) for r in rows))
    out = io.StringIO()
    out.write(f"{shape.describe()}\n{facts['gpu']}, memory floor at {facts['bandwidth_gbs']:.0f} GB/s measured in "
              f"this run; cell = µs (fraction of floor, time / default pick's)\n\n")
    head = ["backend", "profile", *[f"T={t}" for t in tokens], "check rel. L2"]
    out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
    notes = []
    for profile, backend, is_default in backends:
        mine = {r.tokens: r for r in rows if (r.profile, r.backend) == (profile, backend)}
        label = backend + (" (default)" if is_default else "")
        cells = []
        for t in tokens:
            r = mine.get(t)
            if r is None or r.us is None:
                cells.append("-")
                continue
            ratio = f", {r.us / default[t]:.2f}x" if t in default else ""
            cells.append(f"{r.us:.1f} ({r.floor_fraction:.2f}{ratio}){'*' if r.method == 'eager' else ''}")
        rel = next((r.rel_l2 for r in mine.values() if r.rel_l2 is not None), None)
        out.write(f"| {label} | {profile} | " + " | ".join(cells) + f" | {'-' if rel is None else f'{rel:.2e}'} |\n")
        for r in mine.values():
            if r.note and not r.note.startswith("eager"):
                notes.append(f"{backend}: {r.note}")
        if any(r.method == "eager" for r in mine.values()):
            notes.append(f"{backend}: * timed eagerly (its code syncs with the host, so no CUDA graph)")
    if notes:
        out.write("\n" + "\n".join(dict.fromkeys(notes)) + "\n")
    return out.getvalue()


CSV_FIELDS = ("gpu", "layer", "profile", "backend", "default", "tokens", "us", "floor_us", "floor_fraction",
              "ratio_to_default", "method", "check_rel_l2", "note")


def csv_text(shape: LayerShape, rows: Sequence[Row], facts: dict) -> str:
    default = _default_us(rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({
            "gpu": facts["gpu"], "layer": shape.describe(), "profile": r.profile, "backend": r.backend,
            "default": r.default, "tokens": "" if r.tokens is None else r.tokens,
            "us": "" if r.us is None else f"{r.us:.2f}", "floor_us": "" if r.floor_us is None else f"{r.floor_us:.2f}",
            "floor_fraction": "" if r.floor_fraction is None else f"{r.floor_fraction:.3f}",
            "ratio_to_default": (f"{r.us / default[r.tokens]:.3f}"
                                 if r.us is not None and r.tokens in default else ""),
            "method": r.method, "check_rel_l2": "" if r.rel_l2 is None else f"{r.rel_l2:.3e}", "note": r.note})
    return out.getvalue()


def fastest(rows: Sequence[Row], profile: str, tokens: Sequence[int]) -> tuple[str, float] | None:
    """(backend, total µs over the token list) of the fastest backend of `profile` timed at every T, or None."""
    totals: dict[str, float] = {}
    for backend in dict.fromkeys(r.backend for r in rows if r.profile == profile):
        times = {r.tokens: r.us for r in rows if (r.profile, r.backend) == (profile, backend) and r.us is not None}
        if all(t in times for t in tokens):
            totals[backend] = sum(times[t] for t in tokens)  # type: ignore[misc]
    if not totals:
        return None
    best = min(totals, key=lambda b: totals[b])
    return best, totals[best]


def overrides_text(shape: LayerShape, rows: Sequence[Row], facts: dict, tokens: Sequence[int], *, profile: str,
                   policy: str, model: str | None) -> str:
    """A deployment-overrides file (schemas/overrides.schema.json) pinning the profile's fastest backend."""
    import yaml

    best = fastest(rows, profile, tokens)
    if best is None:
        raise BenchError(f"--overrides-out: no backend of profile {profile} was timed at every T, so there is "
                         f"nothing to pin; see the table's notes")
    backend, total = best
    default = next((r.backend for r in rows if r.default), None)
    default_us = _default_us(rows)
    if default == backend:
        versus = " (the default pick)"
    elif default is None:
        versus = ""
    elif all(t in default_us for t in tokens):
        versus = f" vs the default pick {default} {sum(default_us[t] for t in tokens):.1f} us"
    else:
        versus = f"; the default pick {default} was not timed at every T (see the table's notes)"
    why = (f"moe-oracle bench on {facts['gpu']} ({facts['date']}), {shape.describe()}: {backend} "
           f"{total:.1f} us summed over T={','.join(map(str, tokens))}{versus}")
    match: dict[str, Any] = {"policy": policy}
    if model:
        match["model"] = model
    doc = {"overrides": [{"id": f"bench-{shape.name}".replace(",", "-"), "match": match, "backend": backend,
                          "why": why}]}
    return f"# profile {profile}: load with `moe-oracle select --profile {profile} --overrides FILE`\n" + \
        yaml.safe_dump(doc, sort_keys=False, width=120)


def write_files(texts: Iterable[tuple[str, str]]) -> None:
    """Write each (path, text) whole, as every command-line writer does (oracle.safewrite: a temporary file of a
    fresh name renamed into place, never through a symlink that leaves the path's directory)."""
    from oracle.safewrite import write_inside

    for path, text in texts:
        write_inside(Path(path), text)


def check_output_path(flag: str, path: str | None) -> None:
    """An output path whose directory exists, checked before any GPU work."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise BenchError(f"{flag} {path}: directory {directory} does not exist; create it or pick another path")
    if os.path.isdir(path):
        raise BenchError(f"{flag} {path}: is a directory; give a file name")


def write_csv(path: str, shape: LayerShape, rows: Sequence[Row], facts: dict) -> None:
    write_files([(path, csv_text(shape, rows, facts))])


def write_overrides(path: str, shape: LayerShape, rows: Sequence[Row], facts: dict, tokens: Sequence[int], *,
                    profile: str, policy: str, model: str | None, oracle: Any = None) -> None:
    """The overrides file, checked by oracle.overrides against the profile's rules before it is written: a file
    this command writes is always one `select --overrides` accepts."""
    from oracle.overrides import overrides_from_text

    text = overrides_text(shape, rows, facts, tokens, profile=profile, policy=policy, model=model)
    overrides_from_text(text, path, [(oracle or default_oracle()).table(profile)])
    write_files([(path, text)])
