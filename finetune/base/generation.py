"""The decoding flags of `hibert evaluate` and `hibert summarize` (--beam, --min-len, ...), derived from the
`generation:` schema (each field declares its flag: hibert/config/abstractive.py), checked against the
schema's bounds and against each other before any model loads, then laid over an export's own generation
settings."""
from __future__ import annotations

import argparse
import operator
from typing import Any

from hibert.config.abstractive import GenerationConfig

# command-line flag -> (argparse attribute, `generation:` field), from the fields that declare a flag
DECODING_FLAGS = {info.json_schema_extra["flag"]: (info.json_schema_extra["flag"][2:].replace("-", "_"), name)
                  for name, info in GenerationConfig.model_fields.items()
                  if isinstance(info.json_schema_extra, dict) and "flag" in info.json_schema_extra}


_BOUNDS = (("ge", operator.ge, ">="), ("gt", operator.gt, ">"), ("le", operator.le, "<="), ("lt", operator.lt, "<"))


class DecodingFlagError(ValueError):
    """A decoding flag that cannot work (alone, with another flag, or with the model): one line for the user,
    naming the flag."""


def add_generation_arguments(p: argparse.ArgumentParser) -> None:
    # plain int/float here: the bounds are checked by `check_generation_flags` (one line naming the flag)
    g = p.add_argument_group("decoding (abstractive models; default: the model's generation.json)")
    for flag, (dest, name) in DECODING_FLAGS.items():
        info = GenerationConfig.model_fields[name]
        g.add_argument(flag, dest=dest, type=info.annotation, default=None, help=info.json_schema_extra["help"])


def decoding_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The decoding flags given on the command line: `generation:` field -> value."""
    return {name: getattr(args, dest) for dest, name in DECODING_FLAGS.values() if getattr(args, dest, None) is not None}


def _given(settings) -> dict[str, Any]:
    """The decoding flags given (`settings.decoding`: `generation:` field -> value): flag -> value."""
    return {flag: settings.decoding[name] for flag, (_, name) in DECODING_FLAGS.items() if name in settings.decoding}


def check_generation_flags(args) -> None:
    """What the decoding flags tell without a model: each within the `generation:` schema's bounds, and
    --min-len <= --max-len when both are given. Raises `DecodingFlagError` naming the flag."""
    given = _given(args)
    for flag, value in given.items():
        for bound in GenerationConfig.model_fields[DECODING_FLAGS[flag][1]].metadata:
            for attr, ok, word in _BOUNDS:
                limit = getattr(bound, attr, None)
                if limit is not None and not ok(value, limit):  # NaN fails every comparison
                    raise DecodingFlagError(f"{flag} {value}: must be {word} {limit}")
    if "--min-len" in given and "--max-len" in given and given["--min-len"] > given["--max-len"]:
        raise DecodingFlagError(f"--min-len {given['--min-len']} is above --max-len {given['--max-len']}: "
                                "the minimum summary length cannot exceed the maximum")


def generation_from_args(base, args, max_positions: int | None = None):
    """The export's generation settings with the command line's flags on top, checked: every flag (see
    `check_generation_flags`), the minimum against the maximum length wherever each comes from, and (given the
    decoder's `max_positions`) max_length + 1 target positions against the decoder's table. Raises
    `DecodingFlagError` naming the flag (or, for a setting of the export's own, the file)."""
    check_generation_flags(args)
    given = _given(args)
    settings = {**base.model_dump(), **{DECODING_FLAGS[f][1]: v for f, v in given.items()}}
    low, high = settings["min_length"], settings["max_length"]
    if low > high:  # not both flags (check_generation_flags): one side is the model's generation.json
        if "--min-len" in given:
            raise DecodingFlagError(f"--min-len {low} is above the model's maximum length {high} (generation.json); "
                                    "pass --max-len too")
        if "--max-len" in given:
            raise DecodingFlagError(f"--max-len {high} is below the model's minimum length {low} (generation.json); "
                                    "pass --min-len too")
    if max_positions is not None and high + 1 > max_positions:
        what = f"--max-len {high}" if "--max-len" in given else f"the model's generation.json max_length {high}"
        raise DecodingFlagError(f"{what}: the model's decoder has {max_positions} target positions (decoder."
                                f"max_positions in abstractive.json), so at most --max-len {max_positions - 1}")
    return type(base).model_validate(settings)
