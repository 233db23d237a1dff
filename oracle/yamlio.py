"""Safe YAML loading that keeps file:line:col for every key and list item.

PyYAML silently lets a duplicate key win; rule files must not, so we compose the node
tree ourselves (libyaml when available), reject duplicates and build plain data plus a
side table from path tuple to position. Only the safe schema is used: no tags, no code.
"""
from __future__ import annotations

from typing import Any

import yaml

from .errors import Diagnostic, RuleError

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc]
    """The safe loader with its implicit-tag resolution memoized: rule files repeat the same few scalars, and
    the resolver tries its regular expressions in Python for every one of them."""

    _resolved: dict[tuple[Any, str, Any], str] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        key = (kind, value, implicit)
        tag = self._resolved.get(key)
        if tag is None:
            tag = super().resolve(kind, value, implicit)
            if len(self._resolved) < 65536:
                self._resolved[key] = tag
        return tag


_scalar_constructor = yaml.constructor.SafeConstructor()
# a scalar's constructor by tag, called directly: SafeConstructor.construct_object would remember every node it
# built in the shared constructor (a leak of one entry per scalar per load) for anchors rule files cannot use
_SCALARS: dict[str, Any] = {f"tag:yaml.org,2002:{t}": yaml.constructor.SafeConstructor.yaml_constructors[
    f"tag:yaml.org,2002:{t}"] for t in ("int", "float", "bool", "null")}

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
        """Plain data of `node`; the position of every key and list item goes into `marks` (a mapping value is
        located at its key). Exact classes first: the composer builds only these three."""
        cls = node.__class__
        if cls is yaml.ScalarNode:
            return node.value if node.tag == _STR else scalar(node)
        if node.tag not in _SAFE_TAGS:
            problems.append(Diagnostic(file, *_mark(node),
                                       f"tag {node.tag} is not allowed in rule files (rules never build objects)"))
            return None
        if cls is yaml.MappingNode:
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.__class__ is not yaml.ScalarNode:
                    problems.append(Diagnostic(file, *_mark(key_node), "mapping keys must be plain scalars"))
                    continue
                key = key_node.value if key_node.tag == _STR else scalar(key_node)
                sub = path + (key,)
                if key in out:
                    problems.append(Diagnostic(
                        file, *_mark(key_node),
                        f"duplicate key '{key}' (first defined at line {marks[sub][0]}); remove one of them"))
                    continue
                marks[sub] = _mark(key_node)
                out[key] = build(value_node, sub)
            return out
        items = []
        for i, item in enumerate(node.value):
            sub = path + (i,)
            marks[sub] = _mark(item)
            items.append(build(item, sub))
        return items

    def scalar(node: yaml.Node) -> Any:
        if node.tag not in _SAFE_TAGS:
            problems.append(Diagnostic(file, *_mark(node),
                                       f"tag {node.tag} is not allowed in rule files (rules never build objects)"))
            return None
        construct = _SCALARS.get(node.tag) if isinstance(node, yaml.ScalarNode) else None
        try:
            if construct is not None:
                return construct(_scalar_constructor, node)
        except (ValueError, KeyError, IndexError):
            pass
        kind = node.tag.rsplit(":", 1)[-1]
        problems.append(Diagnostic(file, *_mark(node), f"{node.value!r} is not a valid {kind} (tag !!{kind}); "
                                                       "remove the tag or fix the value"))
        return None

    if root is not None:
        marks[()] = _mark(root)
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
    except UnicodeDecodeError as exc:
        raise RuleError([utf8_diagnostic(name, exc)]) from None
    return load_yaml_text(text, name)


def utf8_diagnostic(name: str, exc: UnicodeDecodeError) -> Diagnostic:
    """Where a file stops being UTF-8: line and column of the first bad byte."""
    raw = exc.object if isinstance(exc.object, bytes) else bytes(exc.object)
    before = raw[:exc.start]
    line = before.count(b"\n") + 1
    col = exc.start - (before.rfind(b"\n") + 1) + 1
    return Diagnostic(name, line, col, f"byte 0x{raw[exc.start]:02x} is not UTF-8; rule files are UTF-8 text "
                                       "(save the file as UTF-8)")
