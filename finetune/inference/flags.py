"""The settings flags of `hibert evaluate` and `hibert summarize` (--beam, --k, ...) and the served params:
derived from the registered heads' inference settings (hibert/heads.py `Inference`; each field declares its
flag with hibert.config.base.flag), checked against the fields' bounds before any model loads
(`check_flags`), then laid over an export's own settings once per command (`resolve_settings`): the typed
result is what the evaluator, the summarizer, the corpus driver and the server receive."""
from __future__ import annotations

import argparse
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hibert.heads import HeadSpec, registered_heads

_BOUNDS = (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<="), ("lt", operator.lt, "<"))


class SettingError(ValueError):
    """A flag that cannot work (alone, with another flag, or with the model): one line for the user, naming
    the flag."""


@dataclass(frozen=True)
class Flag:
    flag: str                  # --min-len
    dest: str                  # min_len: the argparse attribute and the served param
    field: str                 # min_length: the settings field
    model: type                # the settings model that declares it
    help: str
    commands: tuple[str, ...]  # the commands it is a flag of

    @property
    def type(self) -> type:
        return self.model.model_fields[self.field].annotation

    def check(self, value: Any) -> None:
        """`value` within the field's bounds (NaN fails every comparison)."""
        for bound in self.model.model_fields[self.field].metadata:
            for attr, ok, word in _BOUNDS:
                limit = getattr(bound, attr, None)
                if limit is not None and not ok(value, limit):
                    raise SettingError(f"{self.flag} {value}: must be {word} {limit}")


def flags_of(model: type) -> dict[str, Flag]:
    """flag -> Flag of the fields of `model` that declare one."""
    out = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "flag" in extra:
            out[extra["flag"]] = Flag(extra["flag"], extra["flag"][2:].replace("-", "_"), name, model,
                                      extra["help"], tuple(extra.get("commands", ("evaluate", "summarize"))))
    return out


def all_flags() -> dict[str, Flag]:
    """Every registered head's flags (heads sharing a settings model share its flags; one flag with two
    meanings is refused)."""
    out: dict[str, Flag] = {}
    for head in registered_heads().values():
        if head.inference is None:
            continue
        for flag, f in flags_of(head.inference.settings).items():
            seen = out.setdefault(flag, f)
            if (seen.field, seen.type) != (f.field, f.type):
                raise SettingError(f"head {head.name!r}: {flag} is already a flag of {seen.model.__name__}."
                                   f"{seen.field} ({seen.type.__name__})")
    return out


def add_flag_arguments(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of `command`, grouped by the heads' settings (plain int/float: `check_flags` checks the
    bounds, one line naming the flag)."""
    groups: dict[type, Any] = {}
    added: set[str] = set()
    for head in registered_heads().values():
        if head.inference is None:
            continue
        for flag, f in flags_of(head.inference.settings).items():
            if command not in f.commands or flag in added:
                continue
            if f.model not in groups:
                groups[f.model] = p.add_argument_group(head.inference.title)
            groups[f.model].add_argument(flag, dest=f.dest, type=f.type, default=None, help=f.help)
            added.add(flag)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings flags given on the command line: flag -> value."""
    return {flag: getattr(args, f.dest) for flag, f in all_flags().items() if getattr(args, f.dest, None) is not None}


def check_flags(given: dict[str, Any]) -> None:
    """What the flags tell without a model: each within its field's bounds, and the heads' rules among the
    flags given (e.g. --min-len <= --max-len). Raises `SettingError` naming the flag."""
    table = all_flags()
    for flag, value in given.items():
        table[flag].check(value)
    checks = {}
    for head in registered_heads().values():
        if head.inference is not None and head.inference.check is not None:
            checks.setdefault(head.inference.check, flags_of(head.inference.settings))
    for check, own in checks.items():
        check({own[f].field: v for f, v in given.items() if f in own}, None, None)


def refuse_foreign(head: HeadSpec, given: dict[str, Any]) -> None:
    """A flag of another head's settings (--beam for an extractive model) is a SettingError: silently ignored, it
    would read as applied."""
    own = flags_of(head.inference.settings) if head.inference is not None else {}
    foreign = sorted(set(given) - set(own))
    if foreign:
        takes = ", ".join(sorted(own)) or "none"
        article = "an" if head.name[:1] in "aeiou" else "a"
        raise SettingError(f"{', '.join(foreign)}: {'does' if len(foreign) == 1 else 'do'} not apply to {article} "
                           f"{head.name} model (its flags: {takes})")


def resolve_settings(head: HeadSpec, export_dir: Path, given: dict[str, Any]) -> Any:
    """The head's inference settings for an export: its own stored settings (read once, no weights) with the
    flags given on top (their bounds were checked by `check_flags`), checked against the head's rules for the
    export. None for a head without settings. A flag of another head's settings (--beam for an extractive model)
    is a SettingError: silently ignored, it would read as applied."""
    refuse_foreign(head, given)
    inference = head.inference
    own = flags_of(inference.settings) if inference is not None else {}
    if inference is None:
        return None
    fields = {own[flag].field: value for flag, value in given.items() if flag in own}
    base = inference.stored(Path(export_dir))
    if inference.check is not None:
        inference.check(fields, base, Path(export_dir))
    try:
        return inference.settings.model_validate({**base.model_dump(), **fields})
    except ValidationError as e:
        raise SettingError(f"{export_dir}: {e.errors()[0]['msg']}") from None


def served_params(head: HeadSpec, resolved: Any) -> dict[str, Any]:
    """param (a flag without dashes) -> the export's own value: what a served model takes, with its defaults."""
    if head.inference is None:
        return {}
    return {f.dest: getattr(resolved, f.field) for f in flags_of(head.inference.settings).values()}


def params_to_flags(head: HeadSpec, params: dict[str, Any]) -> dict[str, Any]:
    """A request's params -> the flags they stand for (`resolve_settings`' `given`, which refuses another head's
    with the same message as the CLI). A served signature declares every head's params, another head's with
    the default None (so that MLflow passes them on instead of dropping them with a warning in the server's
    log): None is "not given". A param of no head is a SettingError naming what the model takes."""
    every = {f.dest: f for f in all_flags().values()}
    own = sorted(f.dest for f in flags_of(head.inference.settings).values()) if head.inference else []
    given = {k: v for k, v in params.items() if v is not None}
    unknown = sorted(set(given) - set(every))
    if unknown:
        raise SettingError(f"unknown params {unknown}: this model takes {own}")
    return {every[k].flag: v for k, v in given.items()}


def flags_as_params(message: str, head: HeadSpec) -> str:
    """A SettingError's message with each flag named as its served param (--max-len -> params.max_len; "its
    flags" -> "its params")."""
    every = all_flags()
    for flag in sorted(every, key=len, reverse=True):
        message = message.replace(flag, f"params.{every[flag].dest}")
    return message.replace("(its flags:", "(its params:")
