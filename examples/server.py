"""A server-style use of moe-oracle: one RuleStore per process, a backend for every MoE layer of a model,
each distinct decision logged once, the rules hot-reloaded while it runs.

    python examples/server.py examples/gpt-oss-120b.config.json --platform cuda:9.0 --package triton_kernels
    python examples/server.py examples/gpt-oss-120b.config.json --demo-edit

--demo-edit serves from a site rules directory (extends the shipped rules, overrides the gpt-oss
policy) and, while it serves, breaks that file and then fixes it: the broken edit is reported once
with file:line and the old rules keep serving; the fixed edit is picked up by the watcher. Exit 0
when the server survived (answers before, during and after the edits as expected).

Which policy a layer asks comes from the profile's rules (`checkpoint_policies`: weight format and
gate/up layout -> policy), so the same config works under every profile. Exit status: 0 when every
layer got an answer (a backend, or `none`), 1 when any layer was refused or malformed (each such
answer printed), 2 for a config this example cannot read.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from oracle.store import RuleStore

log = logging.getLogger("example-server")

SITE_POLICY = """\
policies:
  mxfp4-gpt-oss:
    override: true
    family: mxfp4
    description: "this site's gpt-oss choice"
    candidates: [{candidates}]
    steps:
      - {{id: site-order, try: candidates, why: "the site's preferred order"}}
      - {{id: nothing-fits, outcome: unsupported, message: "no site backend fits", why: "site rules"}}
"""
SITE_PROFILES = ("extends: builtin\ndefault: site\nprofiles:\n"
                 "  site: {description: 'vllm-0.20 + site policy', extends: vllm-0.20, files: [site.yaml]}\n")


#: Hugging Face quant_method -> the checkpoint's weight format (the rules' checkpoint_policies key)
WEIGHT_FORMATS = {"mxfp4": "mxfp4", "modelopt_fp4": "nvfp4"}


def layer_questions(config: dict[str, Any], store: RuleStore) -> list[tuple[int, dict[str, Any]]]:
    """(layer index, question) for every MoE layer of a Hugging Face style config, asking the policy the store's
    default profile names for this checkpoint kind."""
    quant = (config.get("quantization_config") or {}).get("quant_method")
    gpt_oss = config.get("model_type") == "gpt_oss"
    if quant not in WEIGHT_FORMATS:
        raise SystemExit(f"quantization_config.quant_method: {quant!r} has no moe-oracle policy here; "
                         f"expected one of {', '.join(WEIGHT_FORMATS)}")
    oracle = store.generation.oracle
    table = oracle.table(oracle.default_profile)
    by_layout = table.checkpoint_policies.get(WEIGHT_FORMATS[quant], {})
    policy = by_layout.get("interleaved" if gpt_oss else "contiguous")  # gpt-oss interleaves gate and up rows
    if policy is None:
        raise SystemExit(f"profile {table.name} names no policy for {WEIGHT_FORMATS[quant]} checkpoints "
                         "(checkpoint_policies in its rules); pick another profile with --rules")
    moe = {"hidden_size": config["hidden_size"],
           "intermediate_size": config.get("moe_intermediate_size", config["intermediate_size"]),
           "activation": "swigluoai" if gpt_oss else "silu"}
    first_moe = config.get("first_k_dense_replace", 0)
    return [(i, {"policy": policy, "moe": moe}) for i in range(first_moe, config["num_hidden_layers"])]


def select_all(store: RuleStore, model: str, questions: list[tuple[int, dict[str, Any]]]) -> dict[int, str]:
    """What a server does when it loads (or re-shards) a model: one question per layer."""
    out = {}
    for layer, question in questions:
        d = store.select(question, model=model, layer=layer)
        out[layer] = d.backend if d.outcome == "selected" else f"{d.outcome}: {d.error}"
    return out


def _platform(text: str) -> dict[str, Any]:
    kind, _, detail = text.partition(":")
    if kind == "cuda":
        return {"kind": "cuda", "capability": [int(x) for x in detail.split(".")]}
    return {"kind": kind, **({"gcn_arch": detail} if detail else {})}


def demo_edit(config_path: Path, args: argparse.Namespace) -> int:
    config = json.loads(config_path.read_text())
    model = config_path.name.split(".")[0]
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        (site / "profiles.yaml").write_text(SITE_PROFILES)
        policy_file = site / "site.yaml"
        policy_file.write_text(SITE_POLICY.format(candidates="TRITON, MARLIN"))
        store = RuleStore(site, platform=_platform(args.platform), packages={"triton_kernels": True}, env={})
        questions = layer_questions(config, store)
        store.watch(interval=args.poll)
        seen: list[tuple[int, set[str]]] = []
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                before = store.generation.number
                answers = select_all(store, model, questions)
                if store.generation.number == before:  # a reload landed mid-way: the round mixes versions
                    seen.append((before, set(answers.values())))
                time.sleep(0.005)

        server = threading.Thread(target=serve, name="server")
        server.start()

        def wait_for(condition: Any, what: str) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                if time.monotonic() > deadline:
                    raise SystemExit(f"timed out waiting for {what}")
                time.sleep(0.01)

        wait_for(lambda: len(seen) >= 3, "the first answers")
        log.info("serving %d layers of %s: %s", len(questions), model, sorted(seen[-1][1]))
        log.info("operator: writes a typo into %s", policy_file.name)
        policy_file.write_text(SITE_POLICY.format(candidates="MARLINN, TRITON"))
        wait_for(lambda: store.last_error is not None, "the broken edit to be noticed")
        during = len(seen)
        wait_for(lambda: len(seen) >= during + 3, "answers while the rules are broken")
        log.info("still serving generation %d: %s", store.generation.number, sorted(seen[-1][1]))
        log.info("operator: fixes the file (MARLIN first now)")
        policy_file.write_text(SITE_POLICY.format(candidates="MARLIN, TRITON"))
        wait_for(lambda: store.generation.number == 2, "the fixed edit to be loaded")
        after = len(seen)
        wait_for(lambda: len(seen) >= after + 3, "answers from the fixed rules")
        stop.set()
        server.join()
        store.close()
    by_generation: dict[int, set[str]] = {}
    for number, backends in seen:
        by_generation.setdefault(number, set()).update(backends)
    log.info("answers by rules generation: %s", {k: sorted(v) for k, v in sorted(by_generation.items())})
    survived = by_generation == {1: {"TRITON"}, 2: {"MARLIN"}}
    print("survived a broken and a fixed rule edit" if survived else f"unexpected answers: {by_generation}")
    return 0 if survived else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="a model's config.json (Hugging Face layout)")
    ap.add_argument("--rules", help="rules directory (default: the shipped rules)")
    ap.add_argument("--overrides", help="deployment overrides file (schemas/overrides.schema.json)")
    ap.add_argument("--platform", default="cuda:9.0", help="e.g. cuda:9.0 (default), rocm:gfx950, cpu")
    ap.add_argument("--package", action="append", default=[], help="an optional package present (repeatable)")
    ap.add_argument("--audit-log", help="JSON-lines decision log")
    ap.add_argument("--poll", type=float, default=0.05, help="seconds between rule file checks")
    ap.add_argument("--demo-edit", action="store_true", help="break and fix a site rule file while serving")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.demo_edit:
        return demo_edit(args.config, args)
    config = json.loads(args.config.read_text())
    with RuleStore(args.rules, overrides=args.overrides, platform=_platform(args.platform),
                   packages={name: True for name in args.package}, audit_log=args.audit_log) as store:
        answers = select_all(store, args.config.name.split(".")[0], layer_questions(config, store))
    failed = 0
    for backend in sorted(set(answers.values())):
        layers = [i for i, b in answers.items() if b == backend]
        answered = not backend.startswith(("invalid:", "unsupported:", "error:"))
        failed += 0 if answered else len(layers)
        print(f"{backend}: layers {layers[0]}..{layers[-1]} ({len(layers)})",
              file=sys.stdout if answered else sys.stderr)
    if failed:
        print(f"example-server: error: {failed} of {len(answers)} layers got no backend (above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
