"""The tool verbs of the command line: lint, diff, test, sweep, schema, fmt (wired into oracle.cli).

Exit codes as everywhere: 0 clean, 1 findings (lint findings, changed classes, failing goldens, coverage
below --min-coverage, files fmt would change), 2 usage or internal error, 3 broken rules.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import OracleError, did_you_mean
from .report import FORMATS, render

TOOL_COMMANDS = ("lint", "diff", "test", "sweep", "schema", "fmt")
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def to_stderr(message: str, level: str = "error") -> None:
    """The one style of every line the command line writes to stderr: `moe-oracle: LEVEL: message`
    (LEVEL error or warning). Each line of a multi-line message (a RuleError's file:line:col list) gets it."""
    for line in message.splitlines() or [""]:
        print(f"moe-oracle: {level}: {line}", file=sys.stderr)


def must_exist(paths: Sequence[str], what: str) -> None:
    """One error naming every missing path, before a command starts reading."""
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise OracleError(f"{', '.join(missing)}: no such file or directory; name existing {what}")


def add_tool_parsers(sub: Any) -> None:
    def fmt_flag(s: argparse.ArgumentParser) -> None:
        s.add_argument("--format", choices=FORMATS, default="text",
                       help="text for people; json; github (workflow annotations); sarif (code scanning)")

    def vary_flag(s: argparse.ArgumentParser) -> None:
        s.add_argument("--vary", action="append", default=[], metavar="FACT",
                       help="also split this fact into its classes (e.g. moe.weight_key); repeatable")

    s = sub.add_parser("lint", help="evaluate the rules over the whole input space and report dead or shadowed rules")
    s.add_argument("paths", nargs="*", help="rules directories (default: the rules in use)")
    s.add_argument("--profile", help="lint only this profile (default: every profile)")
    s.add_argument("--fail-on", choices=("warning", "error"), default="warning",
                   help="exit 1 on unacknowledged findings of this level or worse (default warning)")
    s.add_argument("--baseline", metavar="FILE", help="findings accepted as they are (a fork's own list; see "
                                                      "--write-baseline); they are reported as acknowledged")
    s.add_argument("--write-baseline", metavar="FILE", help="write every unacknowledged finding into FILE as a "
                                                            "baseline (then give each entry its reason)")
    fmt_flag(s)
    vary_flag(s)
    s = sub.add_parser("diff", help="every input class whose answer changes between two rule sets")
    s.add_argument("a", help="rules directory, profile name, or git:REV[:PATH] (PATH defaults to rules)")
    s.add_argument("b", help="the same kinds as A")
    s.add_argument("--policy", help="compare only this policy")
    s.add_argument("--profile", help="for directory or git sources: compare only this profile")
    s.add_argument("--limit", type=int, default=8, help="classes listed per change in text output (default 8)")
    fmt_flag(s)
    vary_flag(s)
    s = sub.add_parser("test", help="run golden decision files ({scenario, expected}) with coverage")
    s.add_argument("files", nargs="+", help="JSONL or YAML golden files; builtin:NAME for a shipped sample "
                                            "(builtin:golden-sample, builtin:golden-sample-vllm-0.33)")
    s.add_argument("--record", action="store_true",
                   help="write today's answers into the files' expected fields and list what changed (exit 0)")
    s.add_argument("--min-coverage", type=float, default=0.0, metavar="N",
                   help="fail (exit 1) when steps+kernels+backends+outcomes coverage is below N percent")
    fmt_flag(s)
    s = sub.add_parser("sweep", help="the decision matrix platform x configuration as md, csv, json or html")
    s.add_argument("--profile", help="profile (default: the default profile)")
    s.add_argument("--policy", action="append", help="only these policies (repeatable; default: all)")
    s.add_argument("--format", choices=("md", "csv", "json", "html"), default="md", help="output format")
    s.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    vary_flag(s)
    s = sub.add_parser("schema", help="print a JSON Schema of moe-oracle (rules by default)")
    s.add_argument("which", nargs="?", default="rules", help="rules (default), profiles, decision, or another "
                                                             "file name under schemas/ without .schema.json")
    s.add_argument("--write", metavar="DIR", help="instead of printing, write the schemas a rules directory's "
                                                  "modelines name (rules, profiles) into DIR")
    s = sub.add_parser("fmt", help="format rule files canonically, keeping comments")
    s.add_argument("paths", nargs="+", help="rule files or directories")
    s.add_argument("--check", action="store_true", help="change nothing; exit 1 and list files that would change")
    fmt_flag(s)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moe-oracle")
    except PackageNotFoundError:
        return "unknown (not installed)"


def global_options_first(argv: Sequence[str]) -> list[str]:
    """`moe-oracle lint --rules DIR` means `moe-oracle --rules DIR lint`: global options work on either side."""
    args, moved, i = list(argv), [], 0
    while i < len(args):
        if args[i] == "--rules" and i + 1 < len(args):
            moved += args[i:i + 2]
            del args[i:i + 2]
        elif args[i].startswith("--rules="):
            moved.append(args.pop(i))
        else:
            i += 1
    return moved + args


def set_quark(sc: dict[str, Any], item: str) -> None:
    """--quark weight.dtype=fp4 -> scenario quark.weight.dtype; values read as YAML scalars (64, true, null), with
    the bounds of every YAML the oracle reads (no alias expansion, no 5,000-digit integer)."""
    from ..errors import RuleError
    from ..yamlio import load_yaml_text

    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise OracleError(f"--quark {item!r}: expected FIELD=VALUE, e.g. --quark weight.dtype=fp4 "
                         "--quark input.dtype=fp8_e4m3 --quark input.is_dynamic=true")
    node = sc.setdefault("quark", {})
    *path, last = key.split(".")
    for part in path:
        node = node.setdefault(part, {})
    try:
        node[last] = load_yaml_text(raw, f"--quark {item}").data if raw else raw
    except RuleError as exc:
        raise OracleError(str(exc).replace(":1:", ": column ", 1)) from None


def run_tool(args: argparse.Namespace) -> int:
    return int(globals()["_" + args.command](args))


def _rules(args: argparse.Namespace) -> str | None:
    return getattr(args, "rules", None)


def _lint(args: argparse.Namespace) -> int:
    from ..resources import rules_dir
    from .baseline import apply_baseline, baseline_text, read_baseline
    from .lint import lint_source
    from .sources import load_source

    targets = args.paths or [_rules(args) or str(rules_dir())]
    baseline = read_baseline(Path(args.baseline)) if args.baseline else None
    findings = []
    for t in targets:
        whole = not args.profile and Path(t).is_dir()  # every profile: an acknowledgement used by none is stale
        findings += lint_source(load_source(t) if whole else load_source(t, _rules(args), args.profile),
                                tuple(args.vary), unused_allows=whole)
    if baseline is not None:
        for stale in apply_baseline(findings, baseline, Path(args.baseline)):
            to_stderr(stale, "warning")
    if args.write_baseline:
        from ..safewrite import write_inside

        write_inside(Path(args.write_baseline), baseline_text(findings))
        to_stderr(f"wrote {args.write_baseline}: give each entry the reason it is intended", "warning")
    open_ = [f for f in findings if "acknowledged" not in f]
    failing = [f for f in open_ if args.fail_on == "warning" or f["level"] == "error"]
    acked = len(findings) - len(open_)
    summary = (f"{len(open_)} finding(s)" if open_ else "ok: no findings") + (
        f" ({len(failing)} at or above --fail-on {args.fail_on})" if open_ and len(failing) != len(open_) else "") + (
        f"; {acked} acknowledged" if acked else "")
    print(render(findings, args.format, "lint", summary))
    return EXIT_FINDINGS if failing else EXIT_OK


def _diff(args: argparse.Namespace) -> int:
    from .diff import diff_sources, findings, render_text
    from .fingerprint import unchanged
    from .sources import load_source

    a = load_source(args.a, _rules(args), args.profile if args.a.startswith("git:") or Path(args.a).is_dir() else None)
    b = load_source(args.b, _rules(args), args.profile if args.b.startswith("git:") or Path(args.b).is_dir() else None)
    diffs = [] if unchanged(a, b, args.policy) else diff_sources(a, b, args.policy, tuple(args.vary))
    found = findings(diffs, a, b)
    if args.format == "text":
        print(render_text(diffs, a, b, args.limit))
    else:
        n = sum(len(f.get("classes", [])) for f in found)
        print(render(found, args.format, "diff", f"{n} input class(es) change"))
    return EXIT_FINDINGS if found else EXIT_OK


def _test(args: argparse.Namespace) -> int:
    from ..api import Oracle
    from .golden import coverage_text, run_cases

    files = [golden_file(f, args.record) for f in args.files]
    must_exist([str(f) for f in files], "golden files (JSONL or YAML)")
    oracle = Oracle(_rules(args))
    if args.record:
        return _record(oracle, files, args.format)
    failures, n, cov = run_cases(oracle, files)
    pct = cov.percent()
    low = pct < args.min_coverage
    summary = f"{n - len(failures)}/{n} passed; coverage {pct:.1f}%" + (
        f" is below --min-coverage {args.min_coverage:g}%" if low else "")
    if args.format == "text":
        for f in failures:
            print(f"FAIL {f['at']}\n  " + f["message"].replace("\n", "\n  "))
        print(coverage_text(cov))
        print(summary)
    elif args.format == "json":
        print(json.dumps({"tool": "moe-oracle test", "summary": summary, "passed": n - len(failures), "cases": n,
                          "coverage": {"percent": pct, "missed": cov.missed()}, "findings": failures}, indent=1,
                         default=str))
    else:
        extra = [] if not low else [{"rule": "coverage", "level": "error", "at": None, "message": summary}]
        print(render(failures + extra, args.format, "test", summary))
    return EXIT_FINDINGS if failures or low else EXIT_OK


def golden_file(name: str, record: bool = False) -> Path:
    """A golden file argument: a path, or builtin:NAME for a sample shipped with the package."""
    from ..resources import golden_dir

    if not name.startswith("builtin:"):
        return Path(name)
    shipped = sorted(p.stem for p in golden_dir().glob("*.jsonl"))
    stem = name.removeprefix("builtin:").removesuffix(".jsonl")
    if stem not in shipped:
        raise OracleError(f"{name}: no such shipped golden sample{did_you_mean(stem, shipped)}; one of "
                          f"{', '.join('builtin:' + s for s in shipped)}")
    if record:
        raise OracleError(f"{name}: --record rewrites files, never the shipped samples; copy it first "
                          f"(cp {golden_dir() / (stem + '.jsonl')} my-golden.jsonl) and record into the copy")
    return golden_dir() / f"{stem}.jsonl"


def _record(oracle: Any, files: list[Path], fmt: str) -> int:
    from .golden import record_cases

    changes: list[str] = []
    cases = 0
    for path in files:
        found, n = record_cases(oracle, path)
        changes += found
        cases += n
        if fmt == "text":
            print(f"{'recorded' if found else 'unchanged'} {path}: {n} case(s), {len(found)} field(s) changed")
    summary = f"recorded {cases} case(s) in {len(files)} file(s); {len(changes)} expected field(s) changed"
    if fmt == "text":
        print("\n".join(changes + [summary]))
    else:
        found_list = [{"rule": "golden-recorded", "level": "note", "at": c.split(": ", 1)[0],
                       "message": c} for c in changes]
        print(render(found_list, fmt, "test", summary))
    return EXIT_OK


def _sweep(args: argparse.Namespace) -> int:
    from ..resources import rules_dir
    from .sources import load_source
    from .sweep import sweep_policy, to_csv, to_html, to_json, to_markdown

    root = _rules(args) or str(rules_dir())
    src = load_source(args.profile, _rules(args)) if args.profile else load_source(root)
    p = src.profiles[src.default]
    names = args.policy or list(p.table.policies)
    for n in names:
        if n not in p.table.policies:
            raise OracleError(f"--policy {n!r}: not a policy of profile {p.name}{did_you_mean(n, p.table.policies)}; "
                              f"it has {', '.join(p.table.policies)}")
    ms = [sweep_policy(p, n, tuple(args.vary)) for n in names]
    render_fn = {"md": to_markdown, "csv": to_csv, "json": to_json, "html": to_html}[args.format]
    text = render_fn(ms)
    if args.output:
        from ..safewrite import write_inside

        write_inside(Path(args.output), text)
        print(f"wrote {args.output}: {sum(len(m.rows) for m in ms)} configuration classes x platforms, "
              f"{sum(m.decisions for m in ms)} decisions")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


RULES_DIR_SCHEMAS = ("rules.schema.json", "profiles.schema.json")  # what rules/ ships for its modelines


def _schema(args: argparse.Namespace) -> int:
    from ..resources import schemas_dir

    if args.write:
        target = Path(args.write)
        if not target.is_dir():
            raise OracleError(f"--write {args.write}: not a directory; name the rules directory (the one with "
                              "profiles.yaml), whose files' modelines say $schema=../rules.schema.json")
        from ..safewrite import resolve_inside, write_inside

        for name in RULES_DIR_SCHEMAS:  # every target checked before the first write
            resolve_inside(target / name, target)
        for name in RULES_DIR_SCHEMAS:
            write_inside(target / name, (schemas_dir() / name).read_text(encoding="utf-8"), target)
            print(f"wrote {target / name}")
        return EXIT_OK
    path = schemas_dir() / f"{args.which}.schema.json"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".schema.json") for p in schemas_dir().glob("*.schema.json"))
        raise OracleError(f"schema {args.which!r}: no such schema{did_you_mean(args.which, known)}; "
                          f"one of {', '.join(known)}")
    sys.stdout.write(path.read_text(encoding="utf-8"))
    return EXIT_OK


def _fmt(args: argparse.Namespace) -> int:
    from .fmt import format_paths

    must_exist(args.paths, "rule files or directories")
    changed = format_paths([Path(p) for p in args.paths], check=args.check)
    if args.format != "text":
        found = [{"rule": "fmt", "level": "error" if args.check else "note", "at": f"{path}:1",
                  "message": f"{path} is not in canonical layout; run `moe-oracle fmt {path}`" if args.check
                  else f"reformatted {path}"} for path in changed]
        print(render(found, args.format, "fmt", f"{len(changed)} file(s) " + (
            "would be reformatted" if args.check else "reformatted")))
        return EXIT_FINDINGS if changed and args.check else EXIT_OK
    for path in changed:
        print(("would reformat " if args.check else "reformatted ") + str(path))
    if not changed:
        print("ok: nothing to reformat")
    return EXIT_FINDINGS if changed and args.check else EXIT_OK
