"""moe-oracle: schema-validated YAML rule tables that choose a quantized MoE kernel backend.

Never imports torch: selection must run on any machine, in any process, cheaply.
"""
from .api import OUTCOMES, Decision, Oracle, Scenario, default_oracle, select
from .errors import Diagnostic, EnvValueError, OracleError, RuleError, ScenarioError

__all__ = ["Decision", "Diagnostic", "EnvValueError", "OUTCOMES", "Oracle", "OracleError", "RuleError", "Scenario",
           "ScenarioError", "default_oracle", "select"]
