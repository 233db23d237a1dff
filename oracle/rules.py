"""Load rule files, validate them (JSON Schema, then semantics) and merge a profile.

Every problem becomes a Diagnostic at file:line:col with a did-you-mean where a close
name exists; all problems of a load are reported together.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from . import registry
from .errors import Diagnostic, RuleError
from .facts import FACTS, MESSAGE_WORDS
from .resources import rules_dir, schemas_dir
from .yamlio import Located, load_yaml_file

SECTIONS = ("rocm_archs", "quant_keys", "env_vars", "derived", "values", "tables", "kernels", "families", "policies")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


@lru_cache(maxsize=None)
def _schema(schema_name: str) -> dict:
    with open(schemas_dir() / schema_name, encoding="utf-8") as fh:
        return json.load(fh)


@lru_cache(maxsize=None)
def _fast_validator(schema_name: str) -> Any:
    """jsonschema-rs answers 'valid?' ~50x faster than jsonschema; None when it is not installed."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(_schema(schema_name))


@lru_cache(maxsize=None)
def _validator(schema_name: str) -> Any:
    """The reference validator, imported only to explain a failure: its errors carry schema paths."""
    import jsonschema

    schema = _schema(schema_name)
    return jsonschema.validators.validator_for(schema)(schema)


def _schema_message(err: Any) -> str:
    where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    if err.validator == "additionalProperties":
        extra = [k for k in err.instance if k not in err.schema.get("properties", {})] if isinstance(err.instance, dict) else []
        allowed = list(err.schema.get("properties", {}))
        if extra:
            key = extra[0]
            hint = did_you_mean(key, allowed) or (f"; allowed: {', '.join(allowed)}" if allowed else "")
            return f"unknown field '{key}' in {where}{hint}"
    if err.validator == "enum" and isinstance(err.instance, str):
        return f"{where}: '{err.instance}' is not allowed{did_you_mean(err.instance, err.validator_value)}; expected one of {', '.join(map(str, err.validator_value))}"
    if err.validator == "anyOf":
        return f"{where}: {err.instance!r} is not valid here; expected {' or '.join(_describe(a) for a in err.validator_value)}"
    if err.validator == "required":
        return f"{where}: missing required field {err.message.split(' is a required')[0]}"
    if err.validator == "oneOf" and isinstance(err.instance, dict):
        return f"{where}: give exactly one of the alternatives ({_one_of_summary(err.validator_value)})"
    if err.validator == "pattern":
        return f"{where}: {err.instance!r} does not match the required pattern {err.validator_value}"
    return f"{where}: {err.message}"


def _describe(schema: Any) -> str:
    if not isinstance(schema, dict):
        return str(schema)
    if "description" in schema:
        return schema["description"]
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    if "type" in schema:
        kind = schema["type"]
        return " or ".join(kind) if isinstance(kind, list) else f"a {kind}"
    if "anyOf" in schema:
        return " or ".join(_describe(a) for a in schema["anyOf"])
    return "a value matching the schema"


def _one_of_summary(alternatives: list) -> str:
    keys = [" + ".join(a.get("required", [])) for a in alternatives if isinstance(a, dict)]
    return ", ".join(k for k in keys if k) or "see the schema"


def _best_errors(errors: list) -> list:
    """One error per location: the deepest, most specific one."""
    by_path: dict[tuple, Any] = {}
    for err in errors:
        for leaf in _leaves(err):
            key = tuple(leaf.absolute_path)
            if key not in by_path or len(leaf.schema_path) > len(by_path[key].schema_path):
                by_path[key] = leaf
    # drop an error whose location is a strict prefix of another reported location
    paths = list(by_path)
    keep = [p for p in paths if not any(q != p and q[: len(p)] == p for q in paths)]
    return [by_path[p] for p in sorted(keep, key=lambda p: [str(x) for x in p])]


def _leaves(err: Any) -> list:
    if err.validator == "anyOf" and err.context and all(list(sub.absolute_path) == list(err.absolute_path)
                                                        for sub in err.context):
        return [err]  # alternatives for this very value: one message naming them all
    if err.context and err.validator in ("anyOf", "allOf"):
        out: list = []
        for sub in err.context:
            out.extend(_leaves(sub))
        return out
    return [err]


def schema_diagnostics(doc: Located, schema_name: str = "rules.schema.json") -> list[Diagnostic]:
    if not isinstance(doc.data, dict):
        return [doc.diag((), "a rule file must be a mapping of sections (" + ", ".join(SECTIONS) + ")")]
    fast = _fast_validator(schema_name)
    if fast is not None and fast.is_valid(doc.data):
        return []
    validator = _validator(schema_name)
    errors = list(validator.iter_errors(doc.data))
    return [doc.diag(tuple(e.absolute_path), _schema_message(e)) for e in _best_errors(errors)]


@dataclass
class Entry:
    """One named definition with where it came from."""

    name: str
    data: Any
    doc: Located
    path: tuple

    def at(self, *sub: Any) -> str:
        line, _ = self.doc.where(self.path + sub)
        return f"{self.doc.file}:{line}"

    def diag(self, message: str, *sub: Any) -> Diagnostic:
        return self.doc.diag(self.path + sub, message)


@dataclass
class RuleSet:
    """The merged, validated definitions of one profile (or of one standalone file)."""

    name: str
    description: str
    files: list[str]
    sections: dict[str, dict[str, Entry]] = field(default_factory=lambda: {s: {} for s in SECTIONS})


def merge(docs: list[Located], name: str, description: str) -> tuple[RuleSet, list[Diagnostic]]:
    rs = RuleSet(name, description, [d.file for d in docs])
    problems: list[Diagnostic] = []
    for doc in docs:
        for section, items in (doc.data or {}).items():
            if section not in rs.sections or not isinstance(items, dict):
                continue
            for key, value in items.items():
                existing = rs.sections[section].get(key)
                if existing is not None:
                    problems.append(doc.diag((section, key), f"{section} '{key}' is already defined at {existing.at()}; "
                                                             "each name is defined once per profile"))
                    continue
                rs.sections[section][key] = Entry(key, value, doc, (section, key))
    return rs, problems


_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)\}")


class _Semantics:
    """Cross-reference checks that JSON Schema cannot express."""

    def __init__(self, rs: RuleSet):
        self.rs = rs
        self.s = rs.sections
        self.problems: list[Diagnostic] = []
        self.packages_used: set[str] = set()

    def err(self, entry: Entry, message: str, *sub: Any) -> None:
        self.problems.append(entry.diag(message, *sub))

    def known(self, entry: Entry, kind: str, name: Any, choices: Iterable[str], *sub: Any) -> bool:
        choices = list(choices)
        if name in choices:
            return True
        self.err(entry, f"unknown {kind} '{name}'{did_you_mean(name, choices)}", *sub)
        return False

    def condition(self, entry: Entry, cond: Any, *sub: Any) -> None:
        if not isinstance(cond, dict):
            return
        for combinator in ("all", "any"):
            for i, c in enumerate(cond.get(combinator, []) or []):
                self.condition(entry, c, *sub, combinator, i)
        if "not" in cond:
            self.condition(entry, cond["not"], *sub, "not")
        if "ref" in cond:
            self.known(entry, "derived fact", cond["ref"], self.s["derived"], *sub, "ref")
        if "env" in cond:
            if self.known(entry, "environment variable", cond["env"], self.s["env_vars"], *sub, "env"):
                spec = self.s["env_vars"][cond["env"]].data
                if ("eq" in cond or "in" in cond) and spec.get("parse") != "choice":
                    self.err(entry, f"'{cond['env']}' parses as {spec.get('parse')}; test it with 'is', not 'eq'/'in'", *sub)
                for v in [cond.get("eq")] + list(cond.get("in") or []):
                    if v is not None and spec.get("parse") == "choice" and v not in spec.get("choices", []):
                        self.err(entry, f"'{v}' is not a choice of {cond['env']}{did_you_mean(v, spec['choices'])}", *sub)
        if "value" in cond:
            self.known(entry, "value", cond["value"], self.s["values"], *sub, "value")
        if "package" in cond:
            self.packages_used.add(cond["package"])

    def operand(self, entry: Entry, op: Any, *sub: Any) -> None:
        if isinstance(op, dict) and "value" in op:
            self.known(entry, "value", op["value"], self.s["values"], *sub, "value")

    def key(self, entry: Entry, key: Any, *sub: Any) -> None:
        if key is None or key in ("any", "from_scenario"):
            return
        keys = key if isinstance(key, list) else [key]
        for i, k in enumerate(keys):
            if k is not None:
                self.known(entry, "quantization key", k, self.s["quant_keys"], *(sub + ((i,) if isinstance(key, list) else ())))

    def message(self, entry: Entry, text: Any, *sub: Any) -> None:
        if not isinstance(text, str):
            return
        allowed = set(FACTS) | set(self.s["values"]) | set(MESSAGE_WORDS)
        for name in _PLACEHOLDER.findall(text):
            if name not in allowed:
                self.err(entry, f"unknown placeholder '{{{name}}}' in message{did_you_mean(name, allowed)}", *sub)

    def run(self) -> list[Diagnostic]:
        for e in self.s["derived"].values():
            self.condition(e, e.data.get("when"), "when")
        for e in self.s["values"].values():
            self.value(e)
        for e in self.s["kernels"].values():
            self.kernel(e)
        for e in self.s["families"].values():
            self.family(e)
        for e in self.s["policies"].values():
            self.policy(e)
        self.cycles("derived", lambda d: _refs(d.get("when"), "ref"))
        self.cycles("kernels", lambda d: [d["extends"]] if "extends" in d else [])
        return self.problems

    def value(self, e: Entry) -> None:
        d = e.data
        if "of" in d:
            self.operand(e, d["of"], "of")
        if "lookup" in d:
            if self.known(e, "table", d["lookup"], self.s["tables"], "lookup"):
                cols = self.s["tables"][d["lookup"]].data.get("columns", [])
                if len(d.get("keys", [])) != len(cols) - 1:
                    self.err(e, f"table '{d['lookup']}' has {len(cols) - 1} key columns; give as many keys", "keys")
            for i, k in enumerate(d.get("keys", [])):
                self.operand(e, k, "keys", i)
        if "when" in d:
            self.condition(e, d["when"], "when")

    def kernel(self, e: Entry) -> None:
        d = e.data
        if "extends" in d:
            self.known(e, "kernel", d["extends"], self.s["kernels"], "extends")
        for part in ("device", "parallel"):
            self.condition(e, d.get(part), part)
        schemes = d.get("quant_schemes")
        if isinstance(schemes, list):
            for i, row in enumerate(schemes):
                self.key(e, row.get("weight"), "quant_schemes", i, "weight")
                self.key(e, row.get("activation"), "quant_schemes", i, "activation")
                self.condition(e, row.get("when"), "quant_schemes", i, "when")
        uses_format = d.get("format") is not None
        if uses_format and "batched_activation_format" not in self.s["derived"]:
            self.err(e, "kernels with a format need a derived fact 'batched_activation_format'", "format")

    def family(self, e: Entry) -> None:
        d = e.data
        backends = d.get("backends", {})
        self.key(e, d.get("weight_key"), "weight_key")
        for name, b in backends.items():
            for i, k in enumerate(b.get("kernels", [])):
                self.known(e, "kernel", k, self.s["kernels"], "backends", name, "kernels", i)
            self.key(e, b.get("activation_key"), "backends", name, "activation_key")
            if b.get("kernels") and "activation_key" not in b and d.get("activation_key") != "from_scenario":
                self.err(e, f"backend {name} has no activation_key and family '{e.name}' does not take it from the scenario", "backends", name)
            for role in ("converter", "runner"):
                path = b.get(role)
                found = registry.problem(path) if path else None
                if found:
                    self.err(e, f"{role} {found}", "backends", name, role)
        emap = d.get("explicit_map") or {}
        for k, b in (emap.get("entries") or {}).items():
            self.known(e, "backend", b, backends, "explicit_map", "entries", k)
        for a, b in (emap.get("batched") or {}).items():
            self.known(e, "backend", a, backends, "explicit_map", "batched", a)
            self.known(e, "backend", b, backends, "explicit_map", "batched")
        for i, row in enumerate(d.get("round_up") or []):
            for j, b in enumerate(row.get("backends") or []):
                self.known(e, "backend", b, backends, "round_up", i, "backends", j)
            self.condition(e, row.get("when"), "round_up", i, "when")
        for k, text in (d.get("messages") or {}).items():
            self.message(e, text, "messages", k)
        for k, text in (d.get("kernel_reasons") or {}).items():
            self.message(e, text, "kernel_reasons", k)
        if emap and "unknown_moe_backend" not in (d.get("messages") or {}):
            self.err(e, "a family with an explicit_map needs messages.unknown_moe_backend", "messages")

    def policy(self, e: Entry) -> None:
        d = e.data
        if not self.known(e, "family", d.get("family"), self.s["families"], "family"):
            return
        fam = self.s["families"][d["family"]].data
        backends = fam.get("backends", {})
        for i, b in enumerate(d.get("candidates") or []):
            if self.known(e, "backend", b, backends, "candidates", i) and not backends[b].get("kernels"):
                self.err(e, f"candidate {b} has no kernel table; add kernels to it or remove it from the list", "candidates", i)
        seen: dict[str, int] = {}
        steps = d.get("steps") or []
        for i, st in enumerate(steps):
            sid = st.get("id")
            if sid in seen:
                self.err(e, f"duplicate step id '{sid}' (first at step {seen[sid] + 1})", "steps", i, "id")
            seen[sid] = i
            self.condition(e, st.get("when"), "steps", i, "when")
            for key in ("use", "backend"):
                if key in st:
                    self.known(e, "backend", st[key], backends, "steps", i, key)
            for j, b in enumerate(st.get("drop") or []):
                self.known(e, "backend", b, backends, "steps", i, "drop", j)
            if isinstance(st.get("try"), list):
                for j, b in enumerate(st["try"]):
                    if self.known(e, "backend", b, backends, "steps", i, "try", j) and not backends[b].get("kernels"):
                        self.err(e, f"{b} has no kernel table to try", "steps", i, "try", j)
            if st.get("try") == "candidates" and not d.get("candidates"):
                self.err(e, "'try: candidates' needs a candidates list in the policy", "steps", i, "try")
            if "use_explicit" in st and not fam.get("explicit_map"):
                self.err(e, f"family '{d['family']}' has no explicit_map for use_explicit", "steps", i)
            if "call" in st:
                self.known(e, "policy", st["call"], self.s["policies"], "steps", i, "call")
            if "emit" in st:
                for k, op in st["emit"].items():
                    self.operand(e, op, "steps", i, "emit", k)
            self.message(e, st.get("message"), "steps", i, "message")
        if steps and ("when" in steps[-1] or not any(a in steps[-1] for a in ("outcome", "use", "use_explicit", "result"))):
            self.err(e, "the last step must decide unconditionally (no 'when'; outcome, use or result)", "steps", len(steps) - 1)
        for q, spec in (d.get("queries") or {}).items():
            self.known(e, "value", spec.get("value"), self.s["values"], "queries", q, "value")

    def cycles(self, section: str, edges) -> None:
        items = self.s[section]
        state: dict[str, int] = {}

        def visit(name: str, stack: list[str]) -> None:
            if state.get(name) == 2 or name not in items:
                return
            if state.get(name) == 1:
                cyc = stack[stack.index(name):] + [name]
                self.err(items[name], f"{section} reference cycle: {' -> '.join(cyc)}")
                return
            state[name] = 1
            for nxt in edges(items[name].data):
                visit(nxt, stack + [name])
            state[name] = 2

        for n in items:
            visit(n, [])


def _refs(cond: Any, key: str) -> list[str]:
    out: list[str] = []
    if isinstance(cond, dict):
        if key in cond:
            out.append(cond[key])
        for c in cond.get("all", []) + cond.get("any", []):
            out.extend(_refs(c, key))
        if "not" in cond:
            out.extend(_refs(cond["not"], key))
    return out


def semantic_diagnostics(rs: RuleSet) -> tuple[list[Diagnostic], set[str]]:
    sem = _Semantics(rs)
    problems = sem.run()
    return problems, sem.packages_used


# ----------------------------------------------------------------- profiles


@dataclass
class ProfileIndex:
    root: Path
    default: str
    profiles: dict[str, tuple[str, list[str]]]  # name -> (description, files)
    doc: Located


def load_profile_index(root: Path) -> ProfileIndex:
    index_file = root / "profiles.yaml"
    doc = load_yaml_file(str(index_file), _display(index_file))
    problems = schema_diagnostics(doc, "profiles.schema.json")
    if problems:
        raise RuleError(problems)
    profiles = {n: (p["description"], p["files"]) for n, p in doc.data["profiles"].items()}
    if doc.data["default"] not in profiles:
        raise RuleError([doc.diag(("default",), f"default profile '{doc.data['default']}' is not defined{did_you_mean(doc.data['default'], profiles)}")])
    for name, (_, files) in profiles.items():
        for i, f in enumerate(files):
            if not (root / f).is_file():
                raise RuleError([doc.diag(("profiles", name, "files", i), f"rule file '{f}' does not exist under {_display(root)}")])
    return ProfileIndex(root, doc.data["default"], profiles, doc)


def _display(path: Path) -> str:
    """How a rule file is named in messages and traces.

    Shipped rules are named as in the source tree (rules/...), wherever they are installed;
    other files relative to the working directory when below it (short, clickable), else absolute.
    """
    absolute = Path(os.path.abspath(path))
    shipped = Path(os.path.abspath(rules_dir()))
    if absolute.is_relative_to(shipped):
        return str(Path("rules") / absolute.relative_to(shipped))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def load_checked(path: Path, cache: dict | None = None) -> Located:
    """One rule file, parsed and schema-checked; `cache` reuses files shared by several profiles."""
    stat = path.stat() if cache is not None and path.exists() else None
    key = (str(path), stat.st_mtime_ns, stat.st_size) if stat else None
    if key is not None and key in cache:
        return cache[key]
    doc = load_yaml_file(str(path), _display(path))
    found = schema_diagnostics(doc)
    if found:
        raise RuleError(found)
    if key is not None:
        cache[key] = doc
    return doc


def load_files(paths: list[Path], name: str, description: str, cache: dict | None = None) -> tuple[RuleSet, set[str]]:
    """Load, schema-check, merge and semantically check a list of rule files."""
    docs: list[Located] = []
    problems: list[Diagnostic] = []
    for p in paths:
        try:
            docs.append(load_checked(p, cache))
        except RuleError as exc:
            problems.extend(exc.diagnostics)
    if problems:
        raise RuleError(problems)
    rs, problems = merge(docs, name, description)
    sem, packages = semantic_diagnostics(rs)
    problems.extend(sem)
    if problems:
        raise RuleError(problems)
    return rs, packages
