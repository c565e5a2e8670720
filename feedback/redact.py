"""Secret redaction and the code storage modes, applied to every text before it is written.

`redact(text)` replaces what looks like a credential with `[REDACTED:kind]`: private key blocks,
provider tokens with a known shape (AWS, GitHub, GitLab, Slack, Stripe, Google, OpenAI, Anthropic,
npm, PyPI, JWTs), passwords in URLs and connection strings, values assigned to secret-sounding names,
bearer/basic auth headers, and long high-entropy strings. It errs toward redacting: a lost literal
in a training example costs little, a leaked key costs a lot.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["redact", "Redaction", "for_storage", "text_hash", "shannon_entropy"]

_SECRET_NAME = (
    r"(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|client[_-]?secret|auth[_-]?token|credentials?|session[_-]?key|signing[_-]?key|"
    r"(?<=[A-Za-z0-9])[_\-]key\b|(?<=[A-Z0-9])_KEY)"
)

# (kind, pattern, group to replace: 0 for the whole match)
_PATTERNS: list[tuple[str, re.Pattern[str], int]] = [
    (
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY"
            r"(?: BLOCK)?-----|\Z)",
            re.S,
        ),
        0,
    ),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"), 0),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})"), 0),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"), 0),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), 0),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+"), 0),
    ("stripe_key", re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"), 0),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"), 0),
    ("anthropic_key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}"), 0),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{20,}"), 0),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), 0),
    ("pypi_token", re.compile(r"\bpypi-[A-Za-z0-9_\-]{50,}"), 0),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), 0),
    # scheme://user:password@host — the password only, so the URL's shape stays readable.
    ("url_password", re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@'\"]+:([^\s@/'\"]+)@"), 1),
    ("auth_header", re.compile(r"(?i)\b(?:bearer|basic|token)\s+([A-Za-z0-9_\-.=+/]{16,})"), 1),
    # password = "x", "api_key": "x", PASSWORD=x, secret: x
    (
        "assigned_secret",
        re.compile(
            rf"(?i)[\"']?\b[\w.\-]*{_SECRET_NAME}\b[\"']?[ \t]*(?::=|=>|[:=])[ \t]*"
            r"(?:[rbfu]?\"([^\"\n]{3,})\"|[rbfu]?'([^'\n]{3,})'|([^\s,;'\"()\[\]{}#]{6,})(?![(\w.\[]))"
        ),
        -1,
    ),
    # key=value pairs inside connection strings: Password=...;  pwd=...;
    ("conn_string_password", re.compile(r"(?i)\b(?:password|pwd)\s*=\s*([^;'\"\s]+)"), 1),
]

_CANDIDATE = re.compile(r"[A-Za-z0-9+/_\-]{24,}={0,2}")


@dataclass(frozen=True)
class Redaction:
    """The redacted text and what was taken out (kinds only, never values)."""

    text: str
    kinds: tuple[str, ...]


def shannon_entropy(value: str) -> float:
    if not value:
        return 0.0
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def _looks_random(token: str) -> bool:
    """A long token whose characters look drawn at random (keys), not written (identifiers)."""
    classes = sum(bool(re.search(p, token)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    if classes < 2 or "[REDACTED" in token:
        return False
    if re.fullmatch(r"[0-9a-f]{32,}", token) or re.fullmatch(r"[0-9A-F]{32,}", token):
        # hex: the 16-symbol alphabet caps entropy at 4 bits; sha digests are redacted too (cheap).
        return shannon_entropy(token) > 3.0
    if re.fullmatch(r"[A-Za-z]+(?:_[A-Za-z0-9]+)*", token) or re.fullmatch(r"[a-z0-9_]+", token):
        return False  # snake_case / words: identifiers
    # Written identifiers rarely mix digits into runs of both cases this densely.
    digits = sum(c.isdigit() for c in token)
    return shannon_entropy(token) > 4.0 and (digits >= 2 or classes == 3 and len(token) >= 32)


def redact(text: str | None) -> Redaction:
    """`text` with every secret-looking substring replaced by `[REDACTED:kind]`."""
    if not text:
        return Redaction(text or "", ())
    kinds: list[str] = []
    for kind, pattern, group in _PATTERNS:
        text = pattern.sub(lambda m, k=kind, g=group: _replace(m, k, g, kinds), text)
    text = _CANDIDATE.sub(lambda m: _replace_random(m, kinds), text)
    return Redaction(text, tuple(kinds))


def _replace(match: re.Match[str], kind: str, group: int, kinds: list[str]) -> str:
    if group == 0:
        kinds.append(kind)
        return f"[REDACTED:{kind}]"
    if group == -1:  # the first alternative group that matched
        group = next(i for i in range(1, (match.re.groups or 0) + 1) if match.group(i) is not None)
    value = match.group(group)
    if value.startswith("[REDACTED") or _is_placeholder(value):
        return match.group(0)
    kinds.append(kind)
    start, end = match.start(group) - match.start(0), match.end(group) - match.start(0)
    whole = match.group(0)
    return f"{whole[:start]}[REDACTED:{kind}]{whole[end:]}"


def _is_placeholder(value: str) -> bool:
    """Values that are code, not secrets: `password = get_password()`, `token = os.environ[...]`."""
    lowered = value.lower()
    return (
        lowered in {"none", "null", "true", "false", "undefined", "changeme", "xxx", "password", "..."}
        or bool(re.fullmatch(r"[A-Za-z_][\w.]*\(.*", value))  # a call
        or bool(re.fullmatch(r"(?:self|os|env|config|settings|process)\.[\w.\[\]]+", value))
        or bool(re.fullmatch(r"\$\{?\w+\}?|<[\w\-]+>|\{\{.*\}\}|%\(?\w+\)?s?", value))
        or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", value))  # constants, a.b
        or bool(re.search(r"\{[^{}]*\}", value))  # an f-string / template interpolation
    )


def _replace_random(match: re.Match[str], kinds: list[str]) -> str:
    token = match.group(0)
    if not _looks_random(token):
        return token
    kinds.append("high_entropy")
    return "[REDACTED:high_entropy]"


def text_hash(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def for_storage(text: str | None, mode: str) -> tuple[str | None, str | None]:
    """(text to write, its hash) under a storage mode: full | hashed | none. Redacts first, always."""
    if text is None or mode == "none":
        return None, None
    clean = redact(text).text
    digest = text_hash(clean)
    return (clean if mode == "full" else None), digest
