"""Rule sets to analyse: a rules directory, a profile name, or a git revision (`git:REV[:PATH]`).

Tools need the merged rule data (for the constants the rules compare with and for locations)
beside the compiled table, so they load both here rather than through Oracle.
"""
from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from ..errors import OracleError, RuleError, did_you_mean
from ..loader import FileCache, RuleSet, load_profile_index, load_ruleset
from ..model import Table
from ..resources import rules_dir
from ..semantics import semantic_diagnostics
from ..tables import compile_ruleset


@dataclass
class Profiled:
    """One profile: merged rule data and its compiled table."""

    name: str
    rs: RuleSet
    table: Table


@dataclass
class Source:
    """What a command-line source names: profiles (one when a profile was named), the default first."""

    label: str
    profiles: dict[str, Profiled]
    default: str
    strip: str = ""  # a temporary directory prefix shown as `shown` in rule locations (git sources)
    shown: str = ""

    def where(self, at: str | None) -> str:
        if not at:
            return "-"
        return at.replace(self.strip, self.shown) if self.strip else at


def build(files: list[Path], name: str, description: str, cache: FileCache | None = None) -> Profiled:
    rs = load_ruleset(files, name, description, cache)
    problems, packages = semantic_diagnostics(rs)
    if problems:
        raise RuleError(problems)
    return Profiled(name, rs, compile_ruleset(rs, packages))


def load_dir(root: Path, label: str, only: str | None = None, strip: str = "", shown: str = "") -> Source:
    index = load_profile_index(root)
    cache: FileCache = {}
    names = list(index.profiles)
    if only is not None:
        if only not in index.profiles:
            raise OracleError(f"--profile {only!r}: no such profile in {label}{did_you_mean(only, names)}; "
                              f"known: {', '.join(names)}")
        names = [only]
    profiles = {n: build(index.profiles[n].files, n, index.profiles[n].description, cache) for n in names}
    default = only or index.default
    return Source(label, profiles, default, strip, shown)


def _git(args: list[str], cwd: str | None = None) -> bytes:
    """Run git with `args` (built by the callers so that no user text can be read as an option)."""
    return subprocess.run(["git", *args], capture_output=True, check=True, cwd=cwd, timeout=60).stdout


def _check_tree_size(spec: str, path: str, listing: bytes) -> None:
    """Refuse a tree (`git ls-tree -r -l -z` output) past MAX_GIT_FILES files or MAX_GIT_BYTES bytes before it is
    archived into memory: a commit can hold files of any size under the rules path."""
    from ..limits import MAX_GIT_BYTES, MAX_GIT_FILES

    entries = [entry.partition(b"\t")[0].split() for entry in listing.split(b"\0") if entry]
    size = sum(int(meta[3]) for meta in entries if len(meta) == 4 and meta[3].isdigit())
    if len(entries) > MAX_GIT_FILES or size > MAX_GIT_BYTES:
        raise _git_refusal(spec, f"{path} holds {len(entries):,} files of {size:,} bytes there; a rules tree is "
                                 f"read only up to {MAX_GIT_FILES:,} files and {MAX_GIT_BYTES:,} bytes")


def _git_refusal(spec: str, why: str) -> OracleError:
    return OracleError(f"git:{spec}: {why}; name a commit, tag or branch and a directory of this repository, "
                       "e.g. git:HEAD~1:rules")


def _git_tree(rev: str, path: str) -> Path:
    """Extract PATH at REV of the current repository into a temporary directory (kept for the process).

    REV is resolved to a commit id first (`rev-parse --verify --end-of-options`), and only that id and a
    PATH after `--` reach `git archive`: a revision such as `--remote=...:--exec=CMD` or `--output=FILE`
    is refused before any command sees it."""
    spec = f"{rev}:{path}"
    if not rev or rev.startswith("-"):
        raise _git_refusal(spec, f"revision {rev!r} is not a revision (it is empty or starts with '-')")
    parts = Path(path).parts
    if not path or path.startswith("-") or Path(path).is_absolute() or ".." in parts:
        raise _git_refusal(spec, f"path {path!r} must be a relative directory inside the repository (no '..', "
                                 "not starting with '-')")
    try:
        top = _git(["rev-parse", "--show-toplevel"]).decode().strip()
        sha = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
                   cwd=top).decode().strip()
        if not re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", sha):
            raise _git_refusal(spec, f"revision {rev!r} did not resolve to a commit id")
        _check_tree_size(spec, path, _git(["ls-tree", "-r", "-l", "-z", sha, "--", path], cwd=top))
        blob = _git(["archive", "--format=tar", sha, "--", path], cwd=top)
    except subprocess.CalledProcessError as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc.stderr, bytes) else ""
        raise _git_refusal(spec, f"cannot read that revision and path ({detail or 'no such commit'})") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise _git_refusal(spec, f"cannot run git ({exc})") from None
    tmp = Path(tempfile.mkdtemp(prefix="moe-oracle-git-"))
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / path


def load_source(spec: str, rules: str | None = None, profile: str | None = None) -> Source:
    """`git:REV[:PATH]`, a directory with profiles.yaml, or a profile of `rules` (default: the shipped rules)."""
    if spec.startswith("git:"):
        rev, _, path = spec[4:].partition(":")
        root = _git_tree(rev, path or "rules")
        top = root
        for _ in Path(path or "rules").parts:
            top = top.parent
        return load_dir(root, spec, profile, strip=str(top) + "/", shown=f"git:{rev}:")
    p = Path(spec)
    if p.is_dir():
        if not (p / "profiles.yaml").is_file():
            raise OracleError(f"{spec}: not a rules directory (no profiles.yaml); name a rules directory, "
                              "a profile or git:REV[:PATH]")
        return load_dir(p, spec, profile)
    root = Path(rules) if rules else rules_dir()
    index = load_profile_index(root)
    if spec not in index.profiles:
        raise OracleError(f"{spec!r}: neither a rules directory, git:REV[:PATH] nor a profile"
                          f"{did_you_mean(spec, index.profiles)}; profiles: {', '.join(index.profiles)}")
    return load_dir(root, spec, spec)
