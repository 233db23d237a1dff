"""moe-oracle command line: select, explain, validate, profiles, bench (GPU timing of the runnable backends).

Exit codes: 0 answered (selected or none) / rules valid; 1 the answer is invalid or
unsupported; 2 bad usage or a malformed scenario; 3 broken rule files. Bad input never
produces a traceback: every stderr line is `moe-oracle: error: ...` (or `warning:`), naming the
argument or file:line:col and the fix.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .api import Decision, Oracle
from .decision import describe_quant_config
from .errors import OracleError, RuleError
from .facts import PLATFORM_KINDS
from .tools.commands import global_options_first, package_version, set_quark, to_stderr
from .trace import render_lines
from .vocabulary import ACTIVATIONS

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_RULES = 0, 1, 2, 3


class UsageError(Exception):
    """A command-line argument is wrong; the message names it and the fix."""


class _Parser(argparse.ArgumentParser):
    """argparse with the command line's one error style (its subcommand parsers are of this class too)."""

    def error(self, message: str) -> Any:  # argparse's own: usage block, then `prog: error: message`
        verb = self.prog.removeprefix("moe-oracle").strip()
        to_stderr(f"{verb + ': ' if verb else ''}{message} (see `{self.prog} --help`)")
        sys.exit(EXIT_USAGE)


def _parse_platform(text: str) -> dict[str, Any]:
    kind, _, detail = text.partition(":")
    if kind not in PLATFORM_KINDS:
        raise UsageError(f"--platform {text!r}: kind must be one of {', '.join(PLATFORM_KINDS)} "
                         "(e.g. cuda:9.0, rocm:gfx950, xpu, cpu)")
    if kind == "cuda":
        try:
            major, minor = (int(x) for x in detail.split("."))
        except ValueError:
            raise UsageError(f"--platform {text!r}: cuda needs a capability, e.g. cuda:9.0 or cuda:10.0") from None
        return {"kind": "cuda", "capability": [major, minor]}
    if kind == "rocm":
        if not detail:
            raise UsageError(f"--platform {text!r}: rocm needs a gcn arch, e.g. rocm:gfx950")
        return {"kind": "rocm", "gcn_arch": detail}
    if detail:
        raise UsageError(f"--platform {text!r}: {kind} takes no detail; write --platform {kind}")
    return {"kind": kind}


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE, e.g. --env VLLM_MXFP4_USE_MARLIN=0")
        env[name] = value
    return env


def _read_scenario(path: str) -> dict[str, Any]:
    from .limits import MAX_SCENARIO_DEPTH, depth_over
    from .yamlio import load_yaml_text, read_limited

    try:
        _, text = read_limited(path, path, stream=sys.stdin.buffer if path == "-" else None)
    except OSError as exc:
        raise UsageError(f"--scenario {path}: cannot read ({exc.strerror})") from None
    except RuleError as exc:  # larger than the limit, or not UTF-8
        raise UsageError(str(exc).replace("rule files", "scenarios")) from None
    try:  # JSON is YAML; the safe loader never builds objects, and a duplicate key is an error, not the last one
        data = load_yaml_text(text, path).data
    except RuleError as exc:
        raise UsageError(str(exc).replace(": YAML syntax error: ", ": not valid JSON or YAML: ")
                         .replace(" in rule files (rules never build objects)", " in scenarios")) from None
    if depth_over(data, MAX_SCENARIO_DEPTH):
        raise UsageError(f"{path}: the scenario nests deeper than {MAX_SCENARIO_DEPTH} levels (the limit; a "
                         "scenario nests 3)")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a scenario must be a mapping with at least 'policy'")
    return data


def _scenario_from_args(args: argparse.Namespace, oracle: Oracle) -> dict[str, Any]:
    sc: dict[str, Any] = _read_scenario(args.scenario) if args.scenario else {}
    if args.policy:
        sc["policy"] = args.policy
    if args.profile:
        sc["profile"] = args.profile
    if args.query:
        sc["query"] = args.query
    if args.backend:
        sc["backend"] = args.backend
    if args.platform:
        sc["platform"] = _parse_platform(args.platform)
    elif "platform" not in sc:
        from .platform import detect_platform

        sc["platform"] = detect_platform()
    table = oracle.table(sc.get("profile") if isinstance(sc.get("profile"), str) else None)
    if args.detect_packages:
        from .platform import detect_packages

        sc["packages"] = {**detect_packages(table.packages), **(sc.get("packages") or {})}
    if args.detect_env:
        from .platform import env_snapshot

        sc["env"] = {**env_snapshot(table.env_vars), **(sc.get("env") or {})}
    for name in args.package or []:
        sc.setdefault("packages", {})[name] = True
    for name in args.no_package or []:
        sc.setdefault("packages", {})[name] = False
    if args.env:
        sc["env"] = {**(sc.get("env") or {}), **_parse_env(args.env)}
    moe_keys = ("moe_backend", "activation", "lora", "routing_method", "hidden_size", "intermediate_size")
    moe_flags = {key: getattr(args, key) for key in moe_keys if getattr(args, key) is not None}
    if moe_flags:
        sc["moe"] = {**(sc.get("moe") or {}), **moe_flags}
    for item in args.quark or []:
        set_quark(sc, item)
    if "policy" not in sc:
        raise UsageError(f"--policy is required ({', '.join(table.policies)}), or give it in --scenario")
    return sc


def _exit_for(decision: Decision) -> int:
    return {"selected": EXIT_OK, "none": EXIT_OK, "error": EXIT_USAGE}.get(decision.outcome, EXIT_REFUSED)


def _summary(d: Decision) -> str:
    if d.outcome == "selected":
        if d.backend is None:
            answer = {"hidden_size": d.hidden_size, "intermediate_size": d.intermediate_size, **d.extras}
            return "selected: " + ", ".join(f"{k}={v}" for k, v in answer.items() if v is not None)
        parts = [f"selected {d.backend}"]
        if d.kernel:
            parts.append(f"kernel {d.kernel}")
        parts.append(f"activations {d.activation_key or 'bf16'}")
        if d.hidden_size is not None:
            parts.append(f"hidden {d.hidden_size} intermediate {d.intermediate_size}")
        for k, v in d.extras.items():
            if k != "warnings":
                parts.append(f"{k} {json.dumps(v)}")
        return ", ".join(parts)
    if d.outcome == "none":
        extra = "".join(f", {k} {json.dumps(v)}" for k, v in d.extras.items() if k != "warnings")
        reported = f" (backend {d.backend})" if d.backend is not None else ""
        return f"none: the policy selects no fused-MoE backend here{reported}{extra}"
    return f"{d.outcome}: {d.error}"


def _explain_text(d: Decision, scenario: dict[str, Any]) -> str:
    lines = [f"policy {d.policy}   profile {d.profile}"]
    if d.rule_files:
        lines.append("rules  " + ", ".join(d.rule_files))
    plat = scenario.get("platform", {})
    cap = " " + ".".join(map(str, plat["capability"])) if "capability" in plat else ""
    plat_text = plat.get("kind", "?") + cap + \
        (" " + plat["gcn_arch"] if "gcn_arch" in plat else "")
    pk = ", ".join(n for n, v in sorted((scenario.get("packages") or {}).items()) if v) or "(none)"
    env = ", ".join(f"{k}={v}" for k, v in sorted((scenario.get("env") or {}).items())) or "(none)"
    lines.append(f"platform {plat_text}   packages {pk}   env {env}")
    lines.append("")
    lines.append("=> " + _summary(d))
    lines.extend(f"   warning: {w}" for w in d.warnings)
    if d.decided_by:
        step = d.decided_by
        lines.append(f"   decided by step '{step.step}' at {step.at}: {step.why}")
    if d.outcome == "selected" and d.backend is not None:
        missing = f"   ({d.missing_why})" if d.missing_why and not (d.converter and d.runner) else ""
        lines.append(f"   converter {d.converter or 'none'}   runner {d.runner or 'none'}{missing}")
        if d.quant_config is not None:
            lines.append("   " + describe_quant_config(d.quant_config))
    lines.append("")
    render_lines(d.trace, lines)
    return "\n".join(lines)


def _cmd_select(args: argparse.Namespace, oracle: Oracle, explain: bool) -> int:
    if args.batch:
        from .batch import run_batch

        return run_batch(args, oracle)
    sc = _scenario_from_args(args, oracle)
    d = oracle.select(sc, _override(args, oracle, sc), strict=args.strict)
    if args.json:
        print(json.dumps(d.to_dict(with_trace=explain or args.trace), indent=1 if explain else None))
    elif explain:
        print(_explain_text(d, sc))
    elif d.outcome == "error":  # the question is malformed: like a bad flag, a message on stderr and exit 2
        to_stderr(str(d.error))
    else:
        print(_summary(d))
        for w in d.warnings:
            to_stderr(w, "warning")
    return _exit_for(d)


def _override(args: argparse.Namespace, oracle: Oracle, sc: dict[str, Any]) -> Any:
    """The deployment override (--overrides FILE) matching --model/--layer/--role, or None."""
    if not args.overrides:
        if args.model or args.layer is not None or args.role:
            raise UsageError("--model, --layer and --role pick an entry of --overrides FILE; give the file too")
        return None
    from .overrides import load_overrides

    profile = sc.get("profile") if isinstance(sc.get("profile"), str) else None
    found = load_overrides(args.overrides, [oracle.table(profile)])
    return found.find(str(sc["policy"]), args.model, args.layer, args.role)


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validate_paths

    diagnostics, checked = validate_paths([Path(p) for p in args.paths] if args.paths else None, args.rules)
    if args.format != "text":
        from .tools.report import problem_findings, render

        summary = f"{len(diagnostics)} problem(s) in {checked} file(s)" if diagnostics else \
            f"ok: {checked} rule file(s) valid"
        print(render(problem_findings(RuleError(diagnostics)) if diagnostics else [], args.format, "validate",
                     summary))
        return EXIT_RULES if diagnostics else EXIT_OK
    from .limits import MAX_REPORTED_ERRORS

    for d in diagnostics[:MAX_REPORTED_ERRORS]:
        print(d)
    if diagnostics:
        more = len(diagnostics) - MAX_REPORTED_ERRORS
        shown = f" (the first {MAX_REPORTED_ERRORS} listed; --format json lists all)" if more > 0 else ""
        to_stderr(f"{len(diagnostics)} problem(s) in {checked} file(s){shown}")
        return EXIT_RULES
    print(f"ok: {checked} rule file(s) valid")
    return EXIT_OK


def _cmd_plugins(args: argparse.Namespace) -> int:
    """Every registered plugin, checked like the shipped rules on top of the profiles it extends."""
    from .api import build_table
    from .loader import load_profile_index
    from .plugins import discover, extend_index
    from .resources import rules_dir

    found, problems = discover()
    index = load_profile_index(Path(args.rules) if args.rules else rules_dir())
    _, accepted = extend_index(index, found, build_table, report=problems.append)
    for plugin in accepted:
        targets = ", ".join(f"{name} (+{len(files)} file(s))" for name, files in plugin.files.items())
        print(f"ok: {plugin}: {plugin.description}; extends {targets}")
    for message in problems:
        print(message)
    if not found and not problems:
        print("no plugins registered (entry point group moe_oracle.backends)")
    return EXIT_RULES if problems else EXIT_OK


def _cmd_profiles(oracle: Oracle) -> int:
    width = max(len(n) for n in oracle.profiles())
    for name, desc in oracle.profiles().items():
        mark = " (default)" if name == oracle.default_profile else ""
        print(f"{name:<{width}}  {desc}{mark}")
        print(f"{'':<{width}}  policies: {', '.join(oracle.table(name).policies)}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="moe-oracle",
                                description="Select and explain quantized MoE kernel backends from YAML rule tables.")
    p.add_argument("--rules", help="rules directory with profiles.yaml (default: the embedded rules); "
                                   "may also follow the verb")
    p.add_argument("--version", action="version", version=f"moe-oracle {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("select", "answer one question (or a JSONL batch)"),
                            ("explain", "show every step and candidate, accepted or rejected, with rule locations")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--scenario", metavar="FILE", help="scenario file, JSON or YAML ('-' = stdin)")
        if name == "select":
            s.add_argument("--batch", metavar="FILE",
                           help="JSONL file, one scenario per line ('-' = stdin), or {\"scenario\": ..., \"model\", "
                                "\"layer\", \"role\"} for --overrides; every line is answered in order, one JSON "
                                "line each (bad lines too, as outcome error: the batch always keeps going); exit 1 "
                                "if any line is not selected/none")
        s.add_argument("--policy", help="a policy of the profile (see `moe-oracle profiles`)")
        s.add_argument("--profile", help="rule-set profile (see `moe-oracle profiles`)")
        s.add_argument("--platform", help="cuda:MAJOR.MINOR | rocm:GFXARCH | xpu | cpu (default: detected)")
        s.add_argument("--package", action="append", metavar="NAME", help="treat this optional package as installed")
        s.add_argument("--no-package", action="append", metavar="NAME", help="treat this package as absent")
        s.add_argument("--detect-packages", action="store_true", help="use the packages installed here")
        s.add_argument("--detect-env", action="store_true", help="use the declared env vars set here")
        s.add_argument("--env", action="append", metavar="NAME=VALUE",
                       help="an environment variable, exactly as a string")
        s.add_argument("--moe-backend", help="explicit moe_backend string (default auto)")
        s.add_argument("--activation", choices=ACTIVATIONS, help="the experts' activation function")
        s.add_argument("--lora", action="store_const", const=True, default=None, help="LoRA enabled")
        s.add_argument("--routing-method", help="router, e.g. Renormalize, DeepSeekV3 (see kernel routing_methods)")
        s.add_argument("--hidden-size", type=int, help="the layer's hidden size (round_up and size checks)")
        s.add_argument("--intermediate-size", type=int, help="the experts' intermediate size per partition")
        s.add_argument("--quark", action="append", metavar="FIELD=VALUE",
                       help="Quark checkpoint config (the quark.* facts), e.g. weight.dtype=fp4, input.dtype=fp8_e4m3, "
                            "weight.qscheme=per_group, input.is_dynamic=true (repeatable)")
        s.add_argument("--query", help="select (default), round_up, map_backend, or a query the policy declares")
        s.add_argument("--backend", help="backend for the round_up query")
        s.add_argument("--json", action="store_true", help="machine-readable output")
        s.add_argument("--strict", action="store_true",
                       help="answer `error` where the question only earns a warning (an env var like a declared one)")
        s.add_argument("--overrides", metavar="FILE", help="deployment overrides (schemas/overrides.schema.json); "
                                                            "with --batch, each line may name its model/layer/role")
        s.add_argument("--model", help="model name, for --overrides (with --batch: the default of every line)")
        s.add_argument("--layer", type=int, help="layer index, for --overrides (with --batch: the default)")
        s.add_argument("--role", help="the model's role (e.g. draft), for --overrides (with --batch: the default)")
        if name == "select":
            s.add_argument("--trace", action="store_true", help="include the trace in JSON output")
        s.set_defaults(trace=False, batch=None)
    v = sub.add_parser("validate", help="validate rule files: exit 0 when valid, 3 with file:line:col messages")
    v.add_argument("paths", nargs="*", help="rule files or rules directories (default: the rules in use)")
    v.add_argument("--format", choices=("text", "json", "github", "sarif"), default="text",
                   help="text; json; github (workflow annotations); sarif (code scanning)")
    sub.add_parser("profiles", help="list the rule-set profiles and the policies each one has")
    sub.add_parser("plugins", help="list registered plugins and check their rule fragments (exit 3 if broken)")
    from .tools.bench_cli import add_bench_parser
    from .tools.commands import add_tool_parsers
    from .tools.tune_verb import add_tune_parser

    add_tool_parsers(sub)
    add_bench_parser(sub)
    add_tune_parser(sub)
    return p


def _report_problem(args: argparse.Namespace, exc: Exception) -> None:
    """The message on stderr; with a CI format (--format json|github|sarif) the same problems on stdout in
    that format too, so a CI step that reads the report gets a valid one (SARIF listing the errors)."""
    from .tools.report import FORMATS, problem_findings, render

    fmt = getattr(args, "format", "text")
    if fmt in FORMATS and fmt != "text":
        found = problem_findings(exc)
        print(render(found, fmt, args.command, f"{len(found)} problem(s): nothing was checked"))
    to_stderr(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(global_options_first(sys.argv[1:] if argv is None else argv))
    try:
        from .tools.commands import TOOL_COMMANDS, run_tool

        if args.command in TOOL_COMMANDS:
            return run_tool(args)
        if args.command == "tune":
            from .tools.tune_verb import run_tune

            return run_tune(args)
        if args.command == "validate":
            return _cmd_validate(args)
        if args.command == "plugins":
            return _cmd_plugins(args)
        if args.command == "bench":
            from .tools.bench_cli import run_bench

            return run_bench(args)
        oracle = Oracle(args.rules)
        if args.command == "profiles":
            return _cmd_profiles(oracle)
        return _cmd_select(args, oracle, explain=args.command == "explain")
    except RuleError as exc:
        _report_problem(args, exc)
        return EXIT_RULES
    except (UsageError, OracleError) as exc:  # OracleError covers ScenarioError
        _report_problem(args, exc)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a file named on the command line that cannot be read or written
        to_stderr(f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}; check the path "
                  "and its permissions")
        return EXIT_USAGE
    except Exception as exc:  # a bug: still one line, the traceback only on request
        if os.environ.get("MOE_ORACLE_DEBUG"):
            raise
        to_stderr(f"internal error: {type(exc).__name__}: {exc}; this is a bug in moe-oracle, please report it "
                  "with the command line (MOE_ORACLE_DEBUG=1 shows the traceback)")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
