"""Mask credentials before they leave the machine as MLflow params, tags, artifacts or printed URIs.

The whole config is logged as MLflow params, and some of it can carry secrets: a tracking URI with
`user:password@`, a query-string token, `slurm.env` values (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...),
`export X=...` lines in `slurm.setup`. Two rules, both deliberately over-eager (a masked harmless value
costs nothing, a leaked token does):

* by name: a mapping key, env variable, query parameter, `name=value` / `name: value` / `--name value`
  whose name has a secret-looking word (`_SECRET_WORDS`: TOKEN, SECRET, PASSWORD, PASSWD, PWD, PASS, KEY,
  CREDENTIAL(S), AUTH, COOKIE, SESSION, SIG(NATURE), ...; or a word ending in one, like PGPASSWORD or
  ACCESSTOKEN) has its value masked. Names are split into words at `_`/`-`/`.` and camelCase, so
  TOKENIZERS_PARALLELISM, `batch_tokens` or `data.tokenizer` stay readable;
* by shape: the userinfo of any `scheme://user:pass@host` (the password, or a bare `token@`), and
  well-known token formats (GitHub, Hugging Face, OpenAI-style `sk-`, Slack, AWS access key ids).

`config.resolved.yaml` on local disk stays unredacted: it is the exact config a resume reruns.
"""
from __future__ import annotations

import copy
import re
from typing import Any

MASK = "***"

_SECRET_WORDS = {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PWD", "PASS",
                 "PASSPHRASE", "KEY", "KEYS", "APIKEY", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH",
                 "AUTHORIZATION", "COOKIE", "SESSION", "SIGNATURE", "SIG", "SAS", "PAT", "BEARER", "JWT",
                 "DSN"}
# glued compounds: ACCESSTOKEN, AUTHTOKEN, DBPASSWORD, SECRETKEY, APIKEY, OAUTH, ...
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "SECRETKEY",
                    "PRIVATEKEY", "CREDENTIAL", "CREDENTIALS", "OAUTH")
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def _words(name: str) -> list[str]:
    return [w.upper() for part in re.split(r"[^A-Za-z0-9]+", name) for w in _WORD.findall(part)]


def is_secret_name(name: str) -> bool:
    """True when a key/variable/parameter name looks like it holds a credential."""
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in _words(str(name)))


# scheme://userinfo@ — userinfo runs to the LAST '@' before the path, so an unencoded '@' in a
# password is still covered.
_SCHEME = r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://)"   # starts once per word (linear time)
_USERINFO = re.compile(_SCHEME + r"(?P<userinfo>[^/?#\s'\"]*)@")
# name=value (query strings, connection strings, shell assignments, --flag=value); an auth scheme word
# (`auth=Basic <base64>`) is part of the value, so the credential after it is masked too
# Every pattern starts a name only where no name character stands before it (the lookbehinds): a candidate
# starts once per word, so a long unbroken string is scanned in linear time, not once per position (a 40,000-
# character value took a minute).
_NAME_START = r"(?<![A-Za-z0-9_.-])"
_ASSIGN = re.compile(_NAME_START + r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*=\s*)"
                     r"(?P<value>\"[^\"]*\"|'[^']*'|(?:(?i:Bearer|Basic|Token|Digest)\s+)?[^\s&;,'\"]+)")
# `Name: value` headers / YAML / JSON ("name": "value"); the colon must be followed by a space or quote
_COLON = re.compile(_NAME_START + r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\"?\s*:\s+\"?|\"?:\")"
                    r"(?P<value>(?:(?i:Bearer|Basic|Token|Digest)\s+)?[^\s,;\"'}]+)")
# --password value / -p value style flags
_FLAG = re.compile(r"(?<![A-Za-z0-9_-])(?P<name>--[A-Za-z][A-Za-z0-9_-]*)(?P<sep>\s+)"
                   r"(?P<value>\"[^\"]*\"|'[^']*'|(?:(?i:Bearer|Basic|Token|Digest)\s+)?[^\s\"'-][^\s]*)")
# tokens recognisable without a name
_KNOWN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
                    r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16})\b")
# user:password@host where the password holds what a URI may not (/ # ? quotes or a space, unencoded): the
# password runs to the first '@' that is followed by a host (name, IPv4 or [IPv6], and port) and then a path, a
# quote, a space or the end. Quotes are allowed in it (`it's`), so a quoted URI followed by an e-mail address on
# the same line loses the text between them: over-eager on purpose
# (a password of at most 1,024 characters: the search from each scheme stops there, linear time)
_USERINFO_LOOSE = re.compile(_SCHEME + r"(?P<user>[^:/@\s]{0,1024}):(?P<pw>[^\n@]{0,1024}?)"
                             r"@(?=(?:[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]*\]?)(?::\w*)?(?:[/?#\s'\"]|$))")
# secrets carried in a URL path: Slack / Discord / Teams-style incoming webhooks
_WEBHOOK = re.compile(r"(?P<base>https?://(?:hooks\.slack\.com/(?:services|workflows)|(?:[a-z]+\.)?discord(?:app)?\.com"
                      r"/api/webhooks|[A-Za-z0-9.-]+\.webhook\.office\.com/webhookb2))/[^\s'\"]+")
# `-p value` (mysql, sshpass, ... password flags; over-eager on purpose: `-p 22` is masked too)
_SHORT_P = re.compile(r"(?P<flag>(?:^|\s)-p)(?P<sep>\s+)(?P<value>\S+)")


def _mask_userinfo(m: re.Match) -> str:
    user, colon, _ = m.group("userinfo").partition(":")
    if not m.group("userinfo"):
        return m.group(0)
    return f"{m.group('scheme')}{user}:{MASK}@" if colon else f"{m.group('scheme')}{MASK}@"


_MAX_NESTING = 8   # assignments inside assignments looked into; deeper, the value is masked (over-eager)


def _mask_named(m: re.Match, depth: int = 0) -> str:
    value = m.group("value")
    if not is_secret_name(m.group("name")):
        # the value may hold its own assignment: --container-env=WANDB_API_KEY=...
        if depth >= _MAX_NESTING:
            return f"{m.group('name')}{m.group('sep')}{MASK}"
        return f"{m.group('name')}{m.group('sep')}{m.re.sub(lambda inner: _mask_named(inner, depth + 1), value)}"
    if value == MASK:
        return m.group(0)
    q = value[0] if value[:1] in "\"'" and value[-1:] == value[:1] and len(value) > 1 else ""
    return f"{m.group('name')}{m.group('sep')}{q}{MASK}{q}"


def redact_uri(s: str) -> str:
    """`s` with credentials masked: URI userinfo (`https://user:***@host`), secret-named query
    parameters and assignments (`?token=***`, `password=***`, `export HF_TOKEN=***`,
    `X-Api-Key: ***`, `--password ***`) and well-known token formats. Works on a bare URI or on any
    text containing URIs (a setup line, an error message). Non-strings are returned unchanged."""
    if not isinstance(s, str) or not s:
        return s
    out = _USERINFO_LOOSE.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{MASK}@", s)
    out = _USERINFO.sub(_mask_userinfo, out)
    out = _WEBHOOK.sub(lambda m: f"{m.group('base')}/{MASK}", out)
    out = _SHORT_P.sub(lambda m: f"{m.group('flag')}{m.group('sep')}{MASK}", out)
    out = _ASSIGN.sub(_mask_named, out)
    out = _COLON.sub(_mask_named, out)
    out = _FLAG.sub(_mask_named, out)
    return _KNOWN.sub(MASK, out)


redact_text = redact_uri


def _mask_all(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _mask_all(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_mask_all(x) for x in v)
    if v is None or v == "" or isinstance(v, bool):
        return v
    return MASK


def redact_config_dict(d: Any) -> Any:
    """A deep copy of a config dict (or list/str) with secrets masked: values under secret-looking keys
    (any depth: `slurm.env.HF_TOKEN`, a future `tracking.token`), and every string through
    `redact_uri` (`tracking.uri`, `slurm.setup` lines, `slurm.env.MLFLOW_TRACKING_URI`). The input is
    not modified; None/empty values stay as they are (nothing to hide, and "unset" stays visible)."""
    if isinstance(d, dict):
        return {k: _mask_all(v) if is_secret_name(str(k)) else redact_config_dict(v)
                for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return type(d)(redact_config_dict(x) for x in d)
    if isinstance(d, str):
        return redact_uri(d)
    return copy.deepcopy(d)
