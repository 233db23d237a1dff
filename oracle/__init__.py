"""moe-oracle: schema-validated YAML rule tables that choose a quantized MoE kernel backend.

Never imports torch: selection must run on any machine, in any process, cheaply. The modules,
in the order the data flows through them:

    yamlio     YAML with a file:line:col for every node (safe tags only, no duplicate keys)
    schema     JSON Schema check with readable, did-you-mean messages
    loader     profiles (extends, override: true) -> one merged RuleSet
    semantics  cross-references (names, placeholders, cycles, deciding last step)
    literals   rule literals against the scenario's vocabularies (packages, activations, capabilities, env defaults)
    operators  the condition language as one table: schema, code template, explain text
    compiler   conditions, values, messages -> generated code; codegen is the only eval
    kernels    the kernel_checks table + per-kernel requires -> each kernel's checks
    tables     -> model.Table, the frozen decision table of one profile
    scenario   a question -> frozen, hashable Scenario
    interpreter  Table x Scenario -> Result (fast path, or with a typed trace)
    leaves     a failed check's false leaves, actual values and rule locations (traces only)
    decision   -> immutable Decision (to_dict / from_dict); trace: its typed entries
    snapshot   one version of the rules: every profile checked, tables compiled once, caches keyed by content
    api        Oracle: one Snapshot (index, tables, caches) swapped by reload(); select()
    registry   converter/runner paths (backends.* or entry points), resolved lazily
    vocabulary formats under all their names, and the activation list
    cli, validate, platform   the command line, `validate`, detection of this machine
"""
from .api import OUTCOMES, Decision, Oracle, Scenario, default_oracle, select
from .errors import Diagnostic, EnvValueError, OracleError, RuleError, ScenarioError

__all__ = ["Decision", "Diagnostic", "EnvValueError", "OUTCOMES", "Oracle", "OracleError", "RuleError", "Scenario",
           "ScenarioError", "default_oracle", "select"]
