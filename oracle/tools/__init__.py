"""Tooling for rule authors and CI, built on the compiled tables (never on Python that names a policy).

    space   the input space as equivalence classes derived from the rules' own comparisons,
            (each fact, env var and package split only where some rule compares it)
    explore every leaf of that space by lazy forking (only what a decision reads is split)
    sources rule sets from a directory, a profile or a git revision (`git:REV[:PATH]`)
    diff    every input class whose answer changes between two rule sets
    lint    unreachable backends, shadowed steps and kernels, undeclared errors, unused env vars,
            conditions that are always true or always false
    golden  golden decision files with coverage (`moe-oracle test`)
    sweep   the decision matrix as Markdown, CSV, JSON and a self-contained HTML picture
    report  text / json / github / sarif renderings of findings
    fmt     canonical formatting of rule files, comments kept
"""
