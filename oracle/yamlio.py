"""Safe YAML loading that keeps file:line:col for every key and list item.

PyYAML silently lets a duplicate key win; rule files must not, so we compose the node
tree ourselves (libyaml when available), reject duplicates and build plain data plus a
side table from path tuple to position. Only the safe schema is used: no tags, no code.
"""
from __future__ import annotations

import os
from typing import Any, BinaryIO

import yaml

from .errors import Diagnostic, RuleError
from .limits import MAX_ALIASES, MAX_EXPANDED_NODES, MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_YAML_DEPTH

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


def _bounded(root: yaml.Node, file: str) -> Diagnostic | None:
    """The first place where `root` breaks a bound of oracle.limits once its aliases are expanded: nesting
    depth, alias uses, expanded nodes, or an alias to a node that contains it. Each node is visited once
    (an anchored node's size and height are remembered), iteratively: linear time, no recursion."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    aliases = 0

    def children(node: yaml.Node) -> list[tuple[yaml.Node, yaml.Node]]:
        """(child, the node whose place an alias in its position is reported at: its key, or the sequence)."""
        if node.__class__ is yaml.MappingNode:
            out = []
            for key, value in node.value:
                out += [(key, key), (value, key)]
            return out
        return [(item, node) for item in node.value]

    # a frame: [node, depth, children, next child, expanded size so far, height so far]
    frames: list[list[Any]] = []
    if root.__class__ is yaml.ScalarNode:
        return None
    frames.append([root, 1, children(root), 0, 1, 0])
    on_path.add(id(root))
    while frames:
        frame = frames[-1]
        node, depth, kids, i = frame[0], frame[1], frame[2], frame[3]
        if i < len(kids):
            frame[3] = i + 1
            child, site = kids[i]
            key = id(child)
            if key in on_path:
                return Diagnostic(file, *_mark(site), "an alias refers to a node that contains it (a self-referential "
                                               "alias expands forever); copy the data instead of the alias")
            if key in size:
                aliases += 1
                if aliases > MAX_ALIASES:
                    return Diagnostic(file, *_mark(site), f"more than {MAX_ALIASES} alias uses (*name) in one file; "
                                                   "write the data out, or split the file")
                if depth + height[key] > MAX_YAML_DEPTH:
                    return Diagnostic(file, *_mark(site), f"this alias nests the data {depth + height[key]} levels "
                                                   f"deep; the limit is {MAX_YAML_DEPTH}: flatten the structure")
                frame[4] += size[key]
                frame[5] = max(frame[5], height[key])
            elif child.__class__ is yaml.ScalarNode:
                size[key], height[key] = 1, 0
                frame[4] += 1
            else:
                if depth + 1 > MAX_YAML_DEPTH:
                    return Diagnostic(file, *_mark(child), f"nested more than {MAX_YAML_DEPTH} levels deep (the "
                                                           "limit of a YAML document); flatten the structure")
                frames.append([child, depth + 1, children(child), 0, 1, 0])
                on_path.add(key)
                continue
            if frame[4] > MAX_EXPANDED_NODES:
                return Diagnostic(file, *_mark(site), f"the document expands to more than {MAX_EXPANDED_NODES:,} nodes "
                                               "once its aliases are expanded (the limit); use fewer or smaller "
                                               "aliases")
            continue
        frames.pop()
        key = id(node)
        on_path.discard(key)
        size[key], height[key] = frame[4], frame[5] + 1
        if frames:
            parent = frames[-1]
            parent[4] += frame[4]
            parent[5] = max(parent[5], frame[5] + 1)
            if parent[4] > MAX_EXPANDED_NODES:
                return Diagnostic(file, *_mark(node), f"the document expands to more than {MAX_EXPANDED_NODES:,} "
                                                      "nodes once its aliases are expanded (the limit); use fewer "
                                                      "or smaller aliases")
    return None


def load_yaml_text(text: str, file: str) -> Located:
    """Parse one YAML document; raise RuleError(file:line:col) on syntax errors, duplicate or non-text keys,
    or input past a bound of oracle.limits (size, nesting, aliases, integer length)."""
    if len(text) > MAX_FILE_BYTES:
        raise RuleError([Diagnostic(file, 1, 1, f"the file has {len(text):,} characters; the limit is "
                                                f"{MAX_FILE_BYTES:,}: split it into several files")])
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise RuleError([Diagnostic(file, line, col, f"YAML syntax error: {exc.problem or exc}")]) from None
    except yaml.YAMLError as exc:
        raise RuleError([Diagnostic(file, 1, 1, f"YAML error: {exc}")]) from None
    if root is not None:
        bound = _bounded(root, file)
        if bound is not None:
            raise RuleError([bound])
    marks: dict[Path, tuple[int, int]] = {}
    problems: list[Diagnostic] = []

    def build(node: yaml.Node, path: Path) -> Any:
        """Plain data of `node`; the position of every key and list item goes into `marks` (a mapping value is
        located at its key). Exact classes first: the composer builds only these three."""
        cls = node.__class__
        if cls is yaml.ScalarNode:
            if node.tag == _STR:
                if node.value in _NEAR_KEYWORDS and not getattr(node, "style", None):  # plain: None or ""
                    problems.append(Diagnostic(file, *_mark(node), _near_keyword_message(node.value)))
                return node.value
            return scalar(node)
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
                if not isinstance(key, str):
                    problems.append(Diagnostic(file, *_mark(key_node), _key_message(key_node.value, key)))
                    continue
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
        if node.tag == _INT and sum(c.isdigit() for c in node.value) > MAX_INT_DIGITS:
            problems.append(Diagnostic(file, *_mark(node), f"an integer of {sum(c.isdigit() for c in node.value)} "
                                                           f"digits; the limit is {MAX_INT_DIGITS} digits: write a "
                                                           "smaller number"))
            return None
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


def _key_message(text: str, key: Any) -> str:
    kind = "null" if key is None else "a boolean" if isinstance(key, bool) else "an integer" if isinstance(
        key, int) else "a number" if isinstance(key, float) else f"a {type(key).__name__}"
    return (f"key '{text}' reads as {kind} in YAML ({key!r}), not as a name; quote it ('{text}':) or fix it "
            "(keys are names)")


def _edits(word: str) -> set[str]:
    """The typos of `word` that are no other English word: a letter dropped, doubled, or swapped with the next
    (a substituted letter makes real words: null -> full, true -> tree)."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return ({a + b[1:] for a, b in splits if b} | {a + b[0] + b for a, b in splits if b}
            | {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1})


# unquoted words one typo away from YAML's null/true/false read as text (`default: nul` is the string 'nul');
# quoting one says the text is meant
_KEYWORDS = ("null", "true", "false")
_NEAR_KEYWORDS = {w: k for k in _KEYWORDS for w in _edits(k)}
for _k in _KEYWORDS:
    _NEAR_KEYWORDS.pop(_k, None)


def _near_keyword_message(text: str) -> str:
    return (f"'{text}' reads as the text '{text}', one typo from YAML's {_NEAR_KEYWORDS[text]}; write "
            f"{_NEAR_KEYWORDS[text]}, or quote it ('{text}') if the text is meant")


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")}


def read_limited(path: str | os.PathLike[str], name: str, stream: BinaryIO | None = None,
                 limit: int = MAX_FILE_BYTES, advice: str = "split it into several files") -> tuple[bytes, str]:
    """An input file's bytes and text (of `stream` instead, if given: stdin), read no further than `limit` bytes,
    so that a huge file or an endless one (a device, a pipe) costs no more; one RuleError naming it (as `name`)
    when it is larger or not UTF-8. OSError propagates: each caller names the argument the path came from."""
    if stream is not None:
        raw = stream.read(limit + 1)
    else:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise RuleError([Diagnostic(name, 1, 1, f"the file is larger than {limit:,} bytes (the limit); {advice}")])
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RuleError([utf8_diagnostic(name, exc)]) from None


def read_rule_file(path: str | os.PathLike[str], name: str) -> tuple[bytes, str]:
    """read_limited for a rule, profiles or overrides file: unreadable is a RuleError naming it too."""
    try:
        return read_limited(path, name)
    except OSError as exc:
        raise RuleError([Diagnostic(name, 1, 1, f"cannot read rule file: {exc.strerror}")]) from None


def load_yaml_file(path: str, display_name: str | None = None) -> Located:
    name = display_name or path
    return load_yaml_text(read_rule_file(path, name)[1], name)


def utf8_diagnostic(name: str, exc: UnicodeDecodeError) -> Diagnostic:
    """Where a file stops being UTF-8: line and column of the first bad byte."""
    raw = exc.object if isinstance(exc.object, bytes) else bytes(exc.object)
    before = raw[:exc.start]
    line = before.count(b"\n") + 1
    col = exc.start - (before.rfind(b"\n") + 1) + 1
    return Diagnostic(name, line, col, f"byte 0x{raw[exc.start]:02x} is not UTF-8; rule files are UTF-8 text "
                                       "(save the file as UTF-8)")
