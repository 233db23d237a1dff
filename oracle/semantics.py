"""Stage 4: cross-reference checks that JSON Schema cannot express.

Unknown backends, kernels, env vars, derived facts, values, placeholders and checks; a
candidate without kernels; duplicate step ids; reference cycles; a last step that may not
decide. Conditions are walked through the operator table, so a new operator needs no edit here.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from . import literals, operators, registry
from .errors import Diagnostic, did_you_mean
from .facts import FACTS, MESSAGE_WORDS
from .limits import MAX_CONDITION_DEPTH
from .loader import Entry, RuleSet
from .round_up_checks import RoundUpChecks
from .schema import kernel_fields

PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.]+)\}")
# step keys that decide (the last step must have one); old and new spellings
DECIDING_ACTIONS = ("outcome", "use", "use_explicit", "use_named_backend", "result", "return_call_result")


class Semantics(RoundUpChecks):
    """Collects every cross-reference problem of one RuleSet (and the packages its rules test)."""

    def __init__(self, rs: RuleSet):
        self.rs = rs
        self.s = rs.sections
        self.problems: list[Diagnostic] = []
        self.packages_used: set[str] = set()
        self.vocab = literals.vocabularies(self.s)
        self.capability_facts = tuple(f for f, (kind, _) in FACTS.items() if kind == "capability")

    def err(self, entry: Entry, message: str, *sub: Any) -> None:
        self.problems.append(entry.diag(message, *sub))

    def known(self, entry: Entry, kind: str, name: Any, choices: Iterable[str], *sub: Any) -> bool:
        choices = list(choices)
        if name in choices:
            return True
        self.err(entry, f"unknown {kind} '{name}'{did_you_mean(name, choices)}", *sub)
        return False

    def condition(self, entry: Entry, cond: Any, *sub: Any) -> None:
        deep = operators.too_deep(cond, MAX_CONDITION_DEPTH)
        if deep is not None:
            self.err(entry, f"conditions nested more than {MAX_CONDITION_DEPTH} deep (the limit); name an inner "
                            "part as a derived fact ({ref: name}) or flatten all/any", *sub, *deep)
            return
        for node, head, path in operators.walk(cond):
            where = (*sub, *path)
            name = node[head.key]
            if head.refers_to:
                self.known(entry, head.what, name, self.s[head.refers_to], *where, head.key)
            if head.key == "value" and name in self.s["values"]:
                results = literals.value_results(name, self.s["values"], self.s["tables"])
                for sub_path, message in literals.value_leaf(node, name, results) if results else ():
                    self.err(entry, message, *where, *sub_path)
            if head.key == "package":
                self.packages_used.add(name)
                self.known(entry, "package", name, self.s["packages"], *where, "package")
            if head.key == "fact":
                for sub_path, message in literals.fact_leaf(node, self.vocab, self.capability_facts):
                    self.err(entry, message, *where, *sub_path)
            if head.key == "env" and name in self.s["env_vars"]:
                self.env_test(entry, node, self.s["env_vars"][name].data, *where)
            for test in head.tests:  # tests whose argument is another fact or value
                if test.literal == "operand" and test.name in node:
                    self.operand(entry, node[test.name], *where, test.name)

    def env_test(self, entry: Entry, cond: dict[str, Any], spec: dict[str, Any], *sub: Any) -> None:
        name, parse = cond["env"], spec.get("parse")
        if ("eq" in cond or "in" in cond) and parse not in ("choice", "lower"):
            self.err(entry, f"'{name}' parses as {parse}; test it with 'is', not 'eq'/'in'", *sub)
        for v in [cond.get("eq"), *(cond.get("in") or [])]:
            if v is not None and parse == "choice" and v not in spec.get("choices", []):
                self.err(entry, f"'{v}' is not a choice of {name}{did_you_mean(v, spec['choices'])}", *sub)

    def operand(self, entry: Entry, op: Any, *sub: Any) -> None:
        if isinstance(op, dict) and "value" in op:
            self.known(entry, "value", op["value"], self.s["values"], *sub, "value")

    def key(self, entry: Entry, key: Any, *sub: Any) -> None:
        if key is None or key in ("any", "from_scenario", "requested"):
            return
        keys = key if isinstance(key, list) else [key]
        for i, k in enumerate(keys):
            if k is not None:
                at = (*sub, i) if isinstance(key, list) else sub
                self.known(entry, "quantization key", k, self.s["quant_keys"], *at)

    def message(self, entry: Entry, text: Any, *sub: Any) -> None:
        if not isinstance(text, str):
            return
        allowed = set(FACTS) | set(self.s["values"]) | set(MESSAGE_WORDS)
        for name in PLACEHOLDER.findall(text):
            if name not in allowed:
                self.err(entry, f"unknown placeholder '{{{name}}}' in message{did_you_mean(name, allowed)}", *sub)

    def guarded(self, check: Callable[[Entry], None], e: Entry) -> None:
        """Run one entry's checks; an entry the schema already rejected may have any shape: skip what breaks."""
        try:
            check(e)
        except (TypeError, AttributeError, KeyError, ValueError, IndexError):
            pass

    def run(self) -> list[Diagnostic]:
        for e in self.s["env_vars"].values():
            self.guarded(self.env_default, e)
        for e in self.s["derived"].values():
            self.guarded(lambda d: self.condition(d, d.data.get("when"), "when"), e)
        for e in self.s["values"].values():
            self.guarded(self.value, e)
        for e in self.s["kernel_checks"].values():
            self.guarded(self.kernel_check, e)
        for e in self.s["kernels"].values():
            self.guarded(self.kernel, e)
        for e in self.s["families"].values():
            self.guarded(self.family, e)
        for e in self.s["policies"].values():
            self.guarded(self.policy, e)
        for e in self.s["fact_defaults"].values():
            if self.known(e, "fact", e.name, FACTS):
                self.default_value(e, e.name, e.data)
        for e, k in ((e, k) for e in self.s["checkpoint_policies"].values() for k in ("interleaved", "contiguous")):
            self.known(e, "policy", e.data.get(k), self.s["policies"], k)
        self.cycles("derived", lambda d: operators.references(d.get("when"), "derived"))
        self.cycles("kernels", lambda d: [d["extends"]] if "extends" in d else [])
        return self.problems

    def table_keys(self, e: Entry, table: str, keys: list[Any]) -> None:
        """A key cell of a looked-up table that its key value can never be (a typo) would make its row dead."""
        entry = self.s["tables"].get(table)
        rows = entry.data.get("rows") if entry is not None and isinstance(entry.data, dict) else None
        for i, key in enumerate(keys):
            if not (isinstance(key, dict) and set(key) == {"value"} and isinstance(rows, list)):
                continue
            results = literals.value_results(key["value"], self.s["values"], self.s["tables"])
            for r, row in enumerate(rows if results else ()):
                cell = row[i] if isinstance(row, list) and i < len(row) else None
                if not any(cell == x and type(cell) is type(x) for x in results or ()):
                    found = self.s["tables"][table].diag(
                        f"'{cell}' is never a result of value '{key['value']}', the key of this column for value "
                        f"'{e.name}'{did_you_mean(cell, [str(x) for x in results or ()])}; so this row never "
                        f"matches: use one of {', '.join('null' if x is None else str(x) for x in results or ())}",
                        "rows", r, i)
                    if found not in self.problems:
                        self.problems.append(found)

    def default_value(self, e: Entry, fact: str, value: Any, *sub: Any) -> None:
        """A fact's default is a value a scenario could give it: the same closed vocabularies as a literal."""
        for _, message in literals.fact_leaf({"fact": fact, "eq": value}, self.vocab, self.capability_facts):
            self.err(e, message.replace("in 'eq'", "as a default").replace("eq: ", "the default "), *sub)

    def env_default(self, e: Entry) -> None:
        found = literals.env_default_problem(e.name, e.data) if "default" in e.data else None
        if found:
            self.err(e, found, "default")

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
            self.table_keys(e, d["lookup"], d.get("keys") or [])
        if "when" in d:
            self.condition(e, d["when"], "when")
        for i, op in enumerate(d.get("coalesce") or []):
            self.operand(e, op, "coalesce", i)
        for i, case in enumerate(d.get("cases") or []):
            self.condition(e, case.get("when"), "cases", i, "when")
            self.operand(e, case.get("is"), "cases", i, "is")

    def kernel_check(self, e: Entry) -> None:
        d = e.data
        fields = kernel_fields()
        if d.get("field") not in fields:
            self.err(e, f"field '{d.get('field')}' is not a kernel field{did_you_mean(d.get('field'), fields)}; the "
                        f"check would read nothing: one of {', '.join(fields)}", "field")
        self.condition(e, d.get("requires"), "requires")
        by_value = d.get("requires_by_value") or {}
        for v, cond in by_value.items():
            self.condition(e, cond, "requires_by_value", v)
        if by_value and "default" in d and d["default"] not in by_value:
            self.err(e, f"default '{d['default']}' is not a value of requires_by_value"
                        f"{did_you_mean(d['default'], by_value)}; one of {', '.join(map(str, by_value))}", "default")
        self.message(e, d.get("reason"), "reason")

    def kernel(self, e: Entry) -> None:
        d = e.data
        if "extends" in d:
            self.known(e, "kernel", d["extends"], self.s["kernels"], "extends")
        for check in self.s["kernel_checks"].values():
            field = check.data["field"]
            if check.data.get("field_is_condition"):
                self.condition(e, d.get(field), field)
            by_value = check.data.get("requires_by_value")
            if by_value and field in d and d[field] not in by_value:
                self.err(e, f"{field} '{d[field]}' is not a value kernel check '{check.name}' knows"
                            f"{did_you_mean(d[field], by_value)}; one of {', '.join(map(str, by_value))}", field)
            fact = check.data.get("fact_in_field")
            if fact in self.vocab and isinstance(d.get(field), list):
                for i, v in enumerate(d[field]):
                    self.condition(e, v.get("when") if isinstance(v, dict) else None, field, i, "when")  # {is, when}
                    found = literals.unknown_value(self.vocab[fact], fact, v["is"] if isinstance(v, dict) else v)
                    if found:
                        self.err(e, found, field, i, *(("is",) if isinstance(v, dict) else ()))
        schemes = d.get("quant_schemes")
        if isinstance(schemes, list):
            for i, row in enumerate(schemes):
                self.key(e, row.get("weight"), "quant_schemes", i, "weight")
                self.key(e, row.get("activation"), "quant_schemes", i, "activation")
                self.condition(e, row.get("when"), "quant_schemes", i, "when")
        for i, req in enumerate(d.get("requires") or []):
            self.condition(e, req.get("when"), "requires", i, "when")
            self.message(e, req.get("reason"), "requires", i, "reason")
        if d and not self.s["kernel_checks"] and not d.get("extends"):
            self.err(e, "kernels need a kernel_checks table (which capability checks run, in which order); "
                        "see rules/common/kernels.yaml")

    def family(self, e: Entry) -> None:
        d = e.data
        backends = d.get("backends", {})
        self.key(e, d.get("weight_key"), "weight_key")
        for name, b in backends.items():
            for part in ("kernels", "explicit_kernels"):
                for i, k in enumerate(b.get(part, [])):
                    self.known(e, "kernel", k, self.s["kernels"], "backends", name, part, i)
            self.key(e, b.get("activation_key"), "backends", name, "activation_key")
            if b.get("kernels") and "activation_key" not in b and d.get("activation_key") not in ("from_scenario",
                                                                                                  "requested"):
                self.err(e, f"backend {name} has no activation_key and family '{e.name}' does not take it from "
                            "the scenario", "backends", name)
            if "quant_config" in b:
                self.known(e, "quant config kind", b["quant_config"], d.get("quant_configs") or {},
                           "backends", name, "quant_config")
            for role in ("converter", "runner"):
                path = b.get(role)
                found = registry.problem(path) if path else None
                if found:
                    self.err(e, f"{role} {found}", "backends", name, role)
        emap = d.get("explicit_map") or {}
        for k, b in (emap.get("entries") or {}).items():
            for j, name in enumerate(b if isinstance(b, list) else [b]):
                self.known(e, "backend", name, backends, "explicit_map", "entries", k,
                           *((j,) if isinstance(b, list) else ()))
        for a, b in (emap.get("batched") or {}).items():
            self.known(e, "backend", a, backends, "explicit_map", "batched", a)
            self.known(e, "backend", b, backends, "explicit_map", "batched")
        if emap.get("batched") and "batched_when" not in d:
            self.err(e, "explicit_map.batched needs the family's batched_when (the condition for the batched format)",
                     "explicit_map", "batched")
        self.condition(e, d.get("batched_when"), "batched_when")
        for i, row in enumerate(d.get("round_up") or []):
            for j, b in enumerate(row.get("backends") or []):
                self.known(e, "backend", b, backends, "round_up", i, "backends", j)
            self.condition(e, row.get("when"), "round_up", i, "when")
        self.round_up_rows(e, d)
        for k, text in (d.get("messages") or {}).items():
            self.message(e, text, "messages", k)
        for k, text in (d.get("kernel_reasons") or {}).items():
            self.known(e, "kernel check", k, self.s["kernel_checks"], "kernel_reasons", k)
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
                self.err(e, f"candidate {b} has no kernel table; add kernels to it or remove it from the list",
                         "candidates", i)
        seen: dict[str, int] = {}
        steps = d.get("steps") or []
        for i, st in enumerate(steps):
            self.step(e, d, fam, backends, st, i, seen)
        if steps and ("when" in steps[-1] or not any(a in steps[-1] for a in DECIDING_ACTIONS)):
            self.err(e, "the last step must decide unconditionally (no 'when'; outcome, use or result)",
                     "steps", len(steps) - 1)
        for q, spec in (d.get("queries") or {}).items():
            self.known(e, "value", spec.get("value"), self.s["values"], "queries", q, "value")
        for fact, value in (d.get("defaults") or {}).items():
            if self.known(e, "fact", fact, FACTS, "defaults", fact):
                self.default_value(e, fact, value, "defaults", fact)
        self.policy_quant_config(e, d, fam)
        self.operand(e, d.get("activation_key"), "activation_key")

    def policy_quant_config(self, e: Entry, d: dict[str, Any], fam: dict[str, Any]) -> None:
        """`quant_config:` of a policy: listed backends and kinds exist in its family; `by` is a field it emits."""
        spec = d.get("quant_config")
        if not isinstance(spec, dict):
            return
        for i, b in enumerate(spec.get("backends") or []):
            self.known(e, "backend", b, fam.get("backends", {}), "quant_config", "backends", i)
        for value, kind in (spec.get("kinds") or {}).items():
            self.known(e, "quant config kind", kind, fam.get("quant_configs") or {}, "quant_config", "kinds", value)
        emitted = {k for st in d.get("steps") or [] for k in (st.get("emit") or {})}
        if "by" in spec and spec["by"] not in emitted:
            self.err(e, f"quant_config.by names answer field '{spec['by']}', which no emit step of this policy "
                        f"gives; emit it (emit: {{{spec['by']}: ...}}) or name one of {sorted(emitted)}",
                     "quant_config", "by")

    def step(self, e: Entry, d: dict[str, Any], fam: dict[str, Any], backends: dict[str, Any], st: dict[str, Any],
             i: int, seen: dict[str, int]) -> None:
        sid = str(st.get("id"))
        if sid in seen:
            self.err(e, f"duplicate step id '{sid}' (first at step {seen[sid] + 1})", "steps", i, "id")
        seen[sid] = i
        self.condition(e, st.get("when"), "steps", i, "when")
        for key in ("use", "backend"):
            if key in st:
                self.known(e, "backend", st[key], backends, "steps", i, key)
        for j, b in enumerate(st.get("drop") or []):
            self.known(e, "backend", b, backends, "steps", i, "drop", j)
        for j, b in enumerate(st.get("candidates") or []):
            if self.known(e, "backend", b, backends, "steps", i, "candidates", j) and not backends[b].get("kernels"):
                self.err(e, f"candidate {b} has no kernel table; add kernels to it or remove it from the list",
                         "steps", i, "candidates", j)
        for key in ("move", "before", "after"):
            if key in st and self.known(e, "backend", st[key], backends, "steps", i, key):
                listed = [*(d.get("candidates") or []), *(b for s in (d.get("steps") or [])
                                                         if isinstance(s, dict) for b in (s.get("candidates") or []))]
                if st[key] not in listed:
                    self.err(e, f"{key}: {st[key]} is not a candidate of policy '{e.name}' (neither in its "
                                "candidates nor in a step's candidates), so this step would change nothing; name "
                                "a candidate or add it to the candidates", "steps", i, key)
        if "move" in st and ("before" in st) == ("after" in st):
            self.err(e, "a move step names exactly one of 'before' or 'after'", "steps", i, "move")
        needs_message = st.get("prefer_activation") and "use_explicit" in st
        if needs_message and "no_explicit_candidate" not in fam.get("messages", {}):
            self.err(e, "use_explicit with prefer_activation needs the family's messages.no_explicit_candidate "
                        "(the answer when no variant of the string fits the requested key)", "steps", i)
        for key in ("activation_key", "request_activation"):
            self.operand(e, st.get(key), "steps", i, key)
        if isinstance(st.get("try"), list):
            for j, b in enumerate(st["try"]):
                if self.known(e, "backend", b, backends, "steps", i, "try", j) and not backends[b].get("kernels"):
                    self.err(e, f"{b} has no kernel table to try", "steps", i, "try", j)
        if st.get("try") == "candidates" and not d.get("candidates"):
            self.err(e, "'try: candidates' needs a candidates list in the policy", "steps", i, "try")
        if ("use_explicit" in st or "use_named_backend" in st) and not fam.get("explicit_map"):
            self.err(e, f"family '{d['family']}' has no explicit_map for use_named_backend", "steps", i)
        if "call" in st:
            self.known(e, "policy", st["call"], self.s["policies"], "steps", i, "call")
        for k, op in (st.get("emit") or {}).items():
            self.operand(e, op, "steps", i, "emit", k)
        self.message(e, st.get("message"), "steps", i, "message")

    def cycles(self, section: str, edges: Callable[[Any], list[str]]) -> None:
        """Report each reference cycle once; iterative (a chain of thousands of entries is no RecursionError),
        and an entry too malformed to have references (already a schema error) has none."""
        items = self.s[section]
        state: dict[str, int] = {}

        def targets(name: str) -> list[str]:
            try:
                return [t for t in edges(items[name].data) if isinstance(t, str)]
            except (TypeError, AttributeError, KeyError, ValueError, IndexError):
                return []

        for start in items:
            if state.get(start):
                continue
            stack: list[tuple[str, list[str]]] = [(start, targets(start))]
            state[start] = 1
            while stack:
                name, pending = stack[-1]
                if not pending:
                    state[name] = 2
                    stack.pop()
                    continue
                nxt = pending.pop(0)
                if nxt not in items or state.get(nxt) == 2:
                    continue
                if state.get(nxt) == 1:
                    path = [n for n, _ in stack]
                    cyc = path[path.index(nxt):] + [nxt]
                    self.err(items[nxt], f"{section} reference cycle: {' -> '.join(cyc)}")
                    continue
                state[nxt] = 1
                stack.append((nxt, targets(nxt)))


def semantic_diagnostics(rs: RuleSet) -> tuple[list[Diagnostic], set[str]]:
    sem = Semantics(rs)
    problems = sem.run()
    return problems, sem.packages_used
