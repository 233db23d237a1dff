"""Launch configurations as data: one YAML file per GPU model under configs/, schema-checked.

A file lists `gpus` (substrings of the device name) and ordered `entries`; the first entry whose
`when` matches (format, T, E, k, H, I) gives both GEMMs' tiles. configs/default.yaml (`gpus: ["*"]`)
serves every other device. Tables are produced by benchmarks/bench_moe.py --sweep and committed;
nothing is autotuned at serving time.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
_MATCH_KEYS = ("format", "experts", "top_k", "hidden_size", "intermediate_size")


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape and pipeline of one GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    swap_ab: bool
    num_warps: int
    num_stages: int
    split_k: int = 1  # K slices summed afterwards in fixed order (decode: more programs, shorter K loops)
    maxnreg: int | None = None  # register cap per thread: more resident blocks per SM, at the risk of spills
    split_epilogue: str | None = None  # gemm1, split_k > 1: "fused" (last slice program) or "launch" (the default)
    stack_gate_up: bool | None = None  # gemm1: gate and up rows as one weight tile, one dot per step (default: two)
    half_rows: bool | None = None  # blocks whose expert run fills at most half of BLOCK_M multiply only that half


#: half_rows runs half blocks, and an MMA tile has at least 16 rows.
MIN_HALF_ROWS_BLOCK_M = 32

#: Fields only GEMM1 reads; a table setting one on gemm2 is refused rather than silently ignored.
GEMM1_ONLY_FIELDS = ("split_epilogue", "stack_gate_up")


def launch_dict(config: LaunchConfig) -> dict:
    """The config as a tuning-table `gemm1`/`gemm2` mapping (unset optional fields left out, as tables write them)."""
    return {key: value for key, value in asdict(config).items() if value is not None}


@dataclass(frozen=True)
class MoEConfig:
    gemm1: LaunchConfig
    gemm2: LaunchConfig
    source: str  # "file.yaml#entry-index", shown in benchmarks and errors


def _schema_path() -> Path:
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "schemas", here.parents[2] / "oracle" / "_embedded" / "schemas"):
        if (candidate / "tuning.schema.json").is_file():
            return candidate / "tuning.schema.json"
    raise FileNotFoundError("tuning.schema.json not found next to the package (schemas/ or oracle/_embedded/schemas/)")


@functools.cache
def _validator():
    import jsonschema

    schema = json.loads(_schema_path().read_text())
    return jsonschema.Draft202012Validator(schema)


def validate_table(table: dict, origin: str) -> None:
    """Schema check plus the rules a schema cannot say; raises ValueError naming the file and entry."""
    errors = sorted(_validator().iter_errors(table), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise ValueError(f"{origin}: {where}: {first.message} (schema tuning.schema.json)")
    entries = table["entries"]
    if entries[-1]["when"]:
        raise ValueError(f"{origin}: the last entry must have `when: {{}}` so that every call finds a config")
    for index, entry in enumerate(entries):
        if entry["gemm1"]["block_m"] != entry["gemm2"]["block_m"]:
            raise ValueError(f"{origin}: entries/{index}: gemm1.block_m and gemm2.block_m must be equal "
                             f"(both GEMMs walk the same per-expert row blocks)")
        for gemm in ("gemm1", "gemm2"):
            if entry[gemm].get("half_rows") and entry[gemm]["block_m"] < MIN_HALF_ROWS_BLOCK_M:
                raise ValueError(f"{origin}: entries/{index}: {gemm}.half_rows needs block_m >= "
                                 f"{MIN_HALF_ROWS_BLOCK_M} (half a block must still be a 16-row MMA tile); drop it or "
                                 f"raise block_m")
        for field in GEMM1_ONLY_FIELDS:
            if field in entry["gemm2"]:
                raise ValueError(f"{origin}: entries/{index}: gemm2.{field} is a GEMM1 setting (GEMM2 has no split "
                                 f"epilogue and no gate/up halves); move it to gemm1 or drop it")


@functools.cache
def load_table(path: str) -> dict:
    table = yaml.safe_load(Path(path).read_text())
    validate_table(table, Path(path).name)
    return table


def table_for_device(device_name: str | None) -> tuple[str, dict]:
    """(file name, table) of the config file naming this device, the one naming the fewest GPUs (a table swept on
    one GPU kind wins over a table it shares) and then the first by file name; default.yaml otherwise."""
    fallback = None
    naming = []
    for path in sorted(CONFIG_DIR.glob("*.yaml")):
        table = load_table(str(path))
        if table["gpus"] == ["*"]:
            fallback = (path.name, table)
        elif device_name and any(g.lower() in device_name.lower() for g in table["gpus"]):
            naming.append((len(table["gpus"]), path.name, table))
    if naming:
        _, name, table = min(naming, key=lambda found: found[:2])
        return name, table
    if fallback is None:
        raise FileNotFoundError(f"no fallback config (gpus: ['*']) in {CONFIG_DIR}")
    return fallback


def _matches(when: dict, facts: dict) -> bool:
    if "max_tokens" in when and facts["tokens"] > when["max_tokens"]:
        return False
    return all(when[key] == facts[key] for key in _MATCH_KEYS if key in when)


def select_config(*, device_name: str | None, format: str, tokens: int, experts: int, top_k: int,
                  hidden_size: int, intermediate_size: int) -> MoEConfig:
    """The launch config for one call (pure function of the shape; cached by the caller's shapes)."""
    return _select(device_name, format, tokens, experts, top_k, hidden_size, intermediate_size)


@functools.lru_cache(maxsize=4096)
def _select(device_name, format, tokens, experts, top_k, hidden_size, intermediate_size) -> MoEConfig:
    name, table = table_for_device(device_name)
    facts = {"format": format, "tokens": tokens, "experts": experts, "top_k": top_k, "hidden_size": hidden_size,
                 "intermediate_size": intermediate_size}
    for index, entry in enumerate(table["entries"]):
        if _matches(entry["when"], facts):
            return MoEConfig(LaunchConfig(**entry["gemm1"]), LaunchConfig(**entry["gemm2"]), f"{name}#{index}")
    raise AssertionError("unreachable: validate_table guarantees a catch-all last entry")
