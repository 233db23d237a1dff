"""ACME MoE: an example moe-oracle plugin (rules in rules/acme.yaml, code in acme_moe.runner).

moe-oracle never imports this package to answer a question; it imports `acme_moe.runner` only
when a caller resolves the runner of a decision that selected ACME_MXFP4.
"""
