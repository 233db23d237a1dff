"""Safe YAML loading that keeps file:line:col for every key and list item.

PyYAML silently lets a duplicate key win; rule files must not, so we compose the node
tree ourselves (libyaml when available), reject duplicates and build plain data plus a
side table from path tuple to position. Only the safe schema is used: no tags, no code.
"""
from __future__ import annotations

from typing import Any

import yaml

from .errors import Diagnostic, RuleError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_scalar_constructor = yaml.constructor.SafeConstructor()

Path = tuple[Any, ...]  # a path into the document: keys and list indexes


class Located:
    """Plain data of one YAML document plus the position of every node in it."""

    __slots__ = ("file", "data", "marks")

    def __init__(self, file: str, data: Any, marks: dict[Path, tuple[int, int]]):
        self.file = file
        self.data = data
        self.marks = marks

    def where(self, path: Path) -> tuple[int, int]:
        """Position of `path`, or of its closest located ancestor."""
        path = tuple(path)
        while path not in self.marks and path:
            path = path[:-1]
        return self.marks.get(path, (1, 1))

    def diag(self, path: Path, message: str) -> Diagnostic:
        line, col = self.where(path)
        return Diagnostic(self.file, line, col, message)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def load_yaml_text(text: str, file: str) -> Located:
    """Parse one YAML document; raise RuleError(file:line:col) on syntax errors or duplicate keys."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise RuleError([Diagnostic(file, line, col, f"YAML syntax error: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise RuleError([Diagnostic(file, 1, 1, f"YAML error: {exc}")]) from None
    marks: dict[Path, tuple[int, int]] = {}
    problems: list[Diagnostic] = []

    def build(node: yaml.Node, path: Path) -> Any:
        marks.setdefault(path, _mark(node))
        if node.tag not in _SAFE_TAGS:
            problems.append(Diagnostic(file, *_mark(node),
                                       f"tag {node.tag} is not allowed in rule files (rules never build objects)"))
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    problems.append(Diagnostic(file, *_mark(key_node), "mapping keys must be plain scalars"))
                    continue
                key = _scalar_constructor.construct_object(key_node, deep=True)
                if key in out:
                    first = marks[path + (key,)]
                    problems.append(Diagnostic(
                        file, *_mark(key_node),
                        f"duplicate key '{key}' (first defined at line {first[0]}); remove one of them"))
                    continue
                marks[path + (key,)] = _mark(key_node)
                out[key] = build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, path + (i,)) for i, item in enumerate(node.value)]
        if node.tag == _STR:
            return node.value  # the common case, without the constructor's bookkeeping
        return _scalar_constructor.construct_object(node, deep=True)

    data = build(root, ()) if root is not None else None
    if problems:
        raise RuleError(problems)
    return Located(file, data, marks)


_STR = "tag:yaml.org,2002:str"
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}


def load_yaml_file(path: str, display_name: str | None = None) -> Located:
    name = display_name or path
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise RuleError([Diagnostic(name, 1, 1, f"cannot read rule file: {exc.strerror}")]) from None
    return load_yaml_text(text, name)
