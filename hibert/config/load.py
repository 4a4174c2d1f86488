"""Load a recipe YAML into the typed `Config`: section includes, dotted overrides, readable errors.

A section in a recipe may be a mapping, or a string naming a YAML file that holds the section
(`model: hibert_s` -> configs/model/hibert_s.yaml; a path relative to the recipe also works).
Overrides are `dotted.key=value`; the value is parsed as YAML (`1e-4`, `true`, `[0.9, 0.98]`).
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from hibert.config.schema import Config, with_head_sections
from hibert.redact import redact_uri

RESOLVED_NAME = "config.resolved.yaml"


class ConfigError(ValueError):
    """A config problem, with a message that names the file and key."""


def configs_root() -> Path:
    """The shipped configs/ folder (override with $HIBERT_CONFIG_DIR): the source checkout's, or the copy
    installed as the `hibert.configs` package when installed from a wheel."""
    env = os.environ.get("HIBERT_CONFIG_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "configs"
    if (checkout / "recipes").is_dir():
        return checkout
    return Path(str(files("hibert.configs")))


# What a recipe's aliases may expand to: a recipe is a few hundred values; a "billion laughs" (aliases of
# aliases, nine deep) is hundreds of millions, which every pass over the config (interpolation) would walk.
MAX_YAML_VALUES = 100_000


class YamlBoundsError(yaml.YAMLError):
    """YAML whose aliases refer to the node holding them or expand beyond MAX_YAML_VALUES."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def check_expansion(root: yaml.Node) -> None:
    """Count the values `root` expands to, an aliased node once per use (iterative: no recursion limit to hit);
    refuse a cycle (`a: &a [*a]`) and an expansion beyond MAX_YAML_VALUES."""
    size: dict[int, int] = {}
    open_: set[int] = set()      # nodes whose children are still being counted: reaching one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, counted = stack.pop()
        key = id(node)
        if counted:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > MAX_YAML_VALUES:
                raise YamlBoundsError(f"its aliases expand to more than {MAX_YAML_VALUES:,} values (an alias bomb?)")
        elif key in open_:
            raise YamlBoundsError("an alias refers to the node that holds it (a recursive structure)")
        elif key not in size:
            open_.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that checks each document's alias expansion before building it (`check_expansion`)."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            check_expansion(node)
        return node


def safe_load(text: str) -> Any:
    """yaml.safe_load, bounded: raises YamlBoundsError (a yaml.YAMLError) for recursive or exploding aliases
    and RecursionError for nesting deeper than Python's recursion limit."""
    return yaml.load(text, Loader=BoundedLoader)   # a SafeLoader subclass: safe


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory: name a recipe file (configs/recipes/*.yaml) or a recipe name") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it as a YAML recipe ({str(e)[:200]})") from None
    except YamlBoundsError as e:
        raise ConfigError(f"{path}: refused: {e}; write the values out") from None
    except RecursionError:
        raise ConfigError(f"{path}: refused: nested too deeply to be a recipe") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _resolve_include(section: str, ref: str, base_dir: Path | None) -> dict[str, Any]:
    candidates = []
    name = ref if ref.endswith((".yaml", ".yml")) else f"{ref}.yaml"
    if base_dir is not None:
        candidates += [base_dir / name, base_dir / section / name]
    candidates += [configs_root() / section / name, configs_root() / name, Path(name)]
    for c in candidates:
        if c.is_file():
            return _read_yaml(c)
    avail = sorted(p.stem for p in (configs_root() / section).glob("*.yaml"))
    raise ConfigError(f"{section}: no config named {ref!r} (looked in {[str(c) for c in candidates[:3]]}); "
                      f"shipped {section} configs: {avail}")


def _resolve_sections(raw: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    for key in list(raw):
        if key in Config.model_fields and isinstance(raw[key], str):
            raw[key] = _resolve_include(key, raw[key], base_dir)
    return raw


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")   # control characters but tab


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    if _CONTROL.search(item):   # a newline in a value would reach generated scripts (hibert submit) as a new line
        raise ConfigError(f"override {redact_uri(item)[:200]!r}: holds a control character (a newline?); values "
                          "with them belong in a recipe file")
    key, _, value = item.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: empty key")
    try:
        parsed = safe_load(value) if value.strip() else None
    except (YamlBoundsError, RecursionError) as e:
        raise ConfigError(f"override {key!r}: refused: {e or 'nested too deeply'}") from None
    except yaml.YAMLError:
        parsed = value
    if isinstance(parsed, str):  # YAML 1.1 reads "1e-4" as a string; numbers are nicer
        try:
            parsed = float(parsed) if any(c in parsed for c in ".eE") else parsed
        except ValueError:
            pass
    return key.split("."), parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str], base_dir: Path | None) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        if len(path) == 1 and path[0] in Config.model_fields and isinstance(value, str):
            raw[path[0]] = _resolve_include(path[0], value, base_dir)
            continue
        node: Any = raw
        for i, part in enumerate(path[:-1]):
            if isinstance(node, list):   # a list item by its index: data.sources.0.sample_fraction=0.1
                node = _list_item(node, part, item, path[:i + 1])
                continue
            nxt = node.get(part)
            if isinstance(nxt, str) and i == 0 and part in Config.model_fields:
                nxt = _resolve_include(part, nxt, base_dir)
            if nxt is None:
                nxt = {}
            if not isinstance(nxt, (dict, list)) or (isinstance(nxt, list) and not path[i + 1].isdigit()):
                raise ConfigError(f"override {item!r}: {'.'.join(path[:i + 1])} is not a section")
            node[part] = nxt
            node = nxt
        if isinstance(node, list):
            raise ConfigError(f"override {item!r}: {'.'.join(path)} is a list item; set one of its keys")
        node[path[-1]] = value
    return raw


def _list_item(items: list[Any], part: str, item: str, path: list[str]) -> dict[str, Any]:
    """items[int(part)] of an override's path, a mapping (a list holds sections, e.g. data.sources)."""
    index = int(part)
    if index >= len(items):
        raise ConfigError(f"override {item!r}: {'.'.join(path[:-1])} has {len(items)} item(s), no {index}")
    if not isinstance(items[index], dict):
        raise ConfigError(f"override {item!r}: {'.'.join(path)} is not a section")
    return items[index]


_REF = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def _lookup(raw: dict[str, Any], defaults: dict[str, Any], dotted: str) -> Any:
    for source in (raw, defaults):
        node: Any = source
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return node
    raise ConfigError(f"${{{dotted}}}: no such key to interpolate")


def interpolate(raw: dict[str, Any]) -> dict[str, Any]:
    """Replace `${dotted.key}` inside string values (recipes, overrides, pipeline stages) with the value
    of that key, taken from the config being loaded or the schema defaults. One level, no recursion."""
    defaults = Config().model_dump(mode="json")

    def value(m: re.Match) -> str:
        got = str(_lookup(raw, defaults, m.group(1)))
        if _REF.search(got):  # a reference to a reference (or to itself): it would stay literal
            raise ConfigError(f"${{{m.group(1)}}} is itself {got!r}: interpolation is one level; write the "
                              "value out instead")
        return got

    def sub(v: Any) -> Any:
        if isinstance(v, str):
            return _REF.sub(value, v)
        if isinstance(v, list):
            return [sub(x) for x in v]
        if isinstance(v, dict):
            return {k: sub(x) for k, x in v.items()}
        return v

    return sub(raw)


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the section at `loc` (walking nested models and lists)."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if isinstance(model, type) else None
        if field is None:
            return []
        ann = field.annotation
        if get_origin(ann) is list:
            ann = get_args(ann)[0]
        model = ann
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def format_validation_error(err: ValidationError, origin: str) -> str:
    lines = [f"invalid config ({origin}):"]
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc)
        if e["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            parent = ".".join(str(p) for p in loc[:-1])
            hint = f"; did you mean '{parent + '.' if parent else ''}{close[0]}'?" if close else ""
            lines.append(f"  {key}: unknown key{hint} (valid keys here: {', '.join(valid)})")
        elif e["type"] == "value_error":  # our own validators name the keys themselves
            msg = str(e["msg"]).removeprefix("Value error, ")
            lines.append(f"  {msg}" if not key or msg.startswith(key) else f"  {key}: {msg}")
        else:
            got = e.get("input")
            shown = redact_uri(repr(got))
            shown = shown if len(shown) <= 200 else shown[:200] + f"... ({len(shown):,} characters)"  # YAML alias bombs
            got_s = "" if isinstance(got, dict) else f" (got {shown})"
            lines.append(f"  {key or '<root>'}: {e['msg']}{got_s}")
    if len(lines) == 2:  # one problem: one line
        return f"{lines[0]} {lines[1].strip()}"
    if len(lines) > 21:
        lines = [*lines[:21], f"  ... and {len(lines) - 21} more"]
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Recipe file (or defaults when None) + dotted overrides -> validated Config."""
    with_head_sections()  # the heads' sections are keys of the recipe like the core ones
    base_dir = None
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file() and not p.suffix and (configs_root() / "recipes" / f"{p}.yaml").is_file():
            p = configs_root() / "recipes" / f"{p}.yaml"  # `hibert pretrain demo` finds the shipped recipe
        raw = _read_yaml(p)
        base_dir = p.parent
    origin = str(path) if path else "defaults"
    raw = _resolve_sections(raw, base_dir)
    raw = apply_overrides(raw, overrides or [], base_dir)
    raw = interpolate(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as e:  # the overrides are echoed masked: they may carry a tracking URI's password
        shown = f" + overrides {redact_uri(str(overrides))[:500]}" if overrides else ""
        raise ConfigError(format_validation_error(e, origin + shown)) from None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def config_hash(cfg: Config) -> str:
    """Stable hash of the resolved config (recorded in checkpoints to catch mismatched resumes)."""
    blob = json.dumps(config_to_dict(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def save_resolved(cfg: Config, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / RESOLVED_NAME
    # owner-only (mkstemp: 0600): it keeps the real tracking URI (credentials included), since a resume reruns it;
    # a temporary name of its own, so two commands writing the same directory never share one
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{RESOLVED_NAME}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dump_yaml(cfg))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
