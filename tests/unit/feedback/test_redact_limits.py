"""Redaction on bad input: big texts, pathological repetitions, invalid UTF-8, NULs, surrogates.

`redact` must return in bounded time and never raise; where something has to give, it redacts more
(the rest of the text is replaced), never less.
"""

from __future__ import annotations

import random
import sysconfig
import time
from pathlib import Path

import pytest

import feedback.redact as redact_module
from feedback.redact import for_storage, redact, text_hash

GITHUB = "ghp_" + "Zx81Qw0rTy5Ui9Op3As7Df2Gh6Jk4Lm1Nb8V"
AWS = "AKIA" + "QX7WM2RB4TZL9NKP"
PASSWORD = "Cobalt#41mKq!x9"
PEM_BODY = "\n".join(["MIIEowIBAAKCAQEA1x2y3z4" + "Ab9" * 13 + "Qw" for _ in range(4)])


def stdlib_code(size: int) -> str:
    """`size` characters of the interpreter's own library: real code, secret-free."""
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        parts.append(text)
        total += len(text)
        if total >= size:
            break
    text = "".join(parts)
    while len(text) < size:
        text += text
    return text[:size]


def plant(text: str, secrets: dict[int, str]) -> str:
    """`text` with each secret written over it at its position."""
    for position, secret in sorted(secrets.items()):
        text = text[:position] + secret + text[position + len(secret) :]
    return text


def test_20_mb_of_code_is_scanned_whole_in_a_few_seconds():
    chunk = redact_module._CHUNK
    planted = {
        0: f'TOKEN = "{GITHUB}"\n',
        chunk - 20: f"\nAWS_KEY={AWS}\n",  # straddles the first chunk boundary
        5 * chunk - 12: f'\npassword = "{PASSWORD}"\n',  # the name before the boundary, the value after
        7 * chunk - 40: f"\n-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n",
        10_000_000: f"\nredis://:{PASSWORD}@cache:6379\n",
        20_000_000 - 64: f"\nexport GH={GITHUB}\n",
    }
    text = plant(stdlib_code(20_000_000), planted)

    started = time.perf_counter()
    result = redact(text)
    elapsed = time.perf_counter() - started

    assert "unscanned" not in result.kinds, f"{elapsed:.1f} s: the time budget ran out"
    assert elapsed < 15, f"{elapsed:.1f} s for 20 MB"
    for secret in (GITHUB, AWS, PASSWORD, PEM_BODY.splitlines()[0]):
        assert secret not in result.text


PATHOLOGICAL = {
    "a=": "a=" * 100_000,
    "xxxx:yyyy@": "xxxx:yyyy@" * 100_000,
    "scheme://x:y@": "a://xxxx:yyyy@" * 100_000,
    "password=": "password=" * 100_000,
    'password="': 'password="' * 100_000,
    "token: ": "token: " * 100_000,
    "password = f(": "password = f(" * 100_000,
    "quotes": '"' * 1_000_000,
    "BEGIN": "-----BEGIN RSA PRIVATE KEY-----" * 50_000,
    "Cookie": "Cookie: a=b;" * 100_000,
    "curl -u": "curl -u a:b " * 100_000,
    "mysql -p": "mysql -p" * 100_000,
    "one long word": "Ab1" * 1_000_000,
    "NUL": "\x00" * 1_000_000,
    "surrogates": "\udcff\udcfe password=\udcff " * 100_000,
}


@pytest.mark.parametrize("text", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_pathological_repetitions_finish_fast(text):
    started = time.perf_counter()
    result = redact(text)
    elapsed = time.perf_counter() - started
    # The budget for about 1 MB is 3 s; one more chunk may run past it.
    assert elapsed < 8, f"{elapsed:.1f} s"
    assert isinstance(result.text, str)


def test_when_the_time_budget_runs_out_the_rest_is_redacted_whole(monkeypatch):
    chunk = redact_module._CHUNK
    ticks = iter(range(1_000_000))
    monkeypatch.setattr(redact_module.time, "monotonic", lambda: float(next(ticks)))
    monkeypatch.setattr(redact_module, "_BUDGET_S", 2.0)
    monkeypatch.setattr(redact_module, "_BUDGET_S_PER_MB", 0.0)
    # The clock moves one second a look: chunks 0 and 1 are scanned, then the budget is spent.
    text = plant(stdlib_code(5 * chunk), {100: f"\nTOKEN={GITHUB}\n", 3 * chunk + 100: f"\nAWS={AWS}\n"})

    result = redact(text)

    assert GITHUB not in result.text and AWS not in result.text
    assert result.kinds[-1] == "unscanned"
    assert result.text.endswith("[REDACTED:unscanned]")
    assert result.text.startswith(text[:100])  # the scanned part is kept


@pytest.mark.parametrize(
    "raw",
    [
        f"password={PASSWORD}\udcff\x00 done".encode("utf-8", "surrogateescape"),
        f"token = '{GITHUB}'\n\xff\xfe\x00".encode("latin-1", "replace") + b"\xc3\x28\xa0\xa1",
        b"\xff" * 10_000 + f"\nAWS_ACCESS_KEY_ID={AWS}\n".encode(),
    ],
)
def test_invalid_utf8_bytes_are_read_and_redacted(raw):
    result = redact(raw)
    assert isinstance(result.text, str)
    for secret in (PASSWORD, GITHUB, AWS):
        assert secret not in result.text


@pytest.mark.parametrize(
    "text",
    [
        f"\udcffpassword = '{PASSWORD}'\udcff",
        f"\x00{AWS}\x00",
        f"db = 'postgres://app:{PASSWORD}@db/app'\ud800",
        f"\udc80\udc80 Authorization: Bearer {GITHUB} \udc80",
        "\x00" * 100 + f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n",
    ],
)
def test_nul_bytes_and_lone_surrogates_are_ordinary_characters(text):
    result = redact(text)
    for secret in (PASSWORD, AWS, GITHUB, PEM_BODY[:24]):
        assert secret not in result.text
    clean, digest = for_storage(text, "full")
    assert clean == result.text and digest == text_hash(result.text)
    result.text.encode("utf-8")  # storable: lone surrogates came back as U+FFFD


def test_random_garbage_never_raises():
    rng = random.Random(7)
    pieces = [
        "password", "token", "key", "secret", "auth", "Authorization:", "Cookie:", "Bearer ", "=", ":",
        ": ", " = ", "'", '"', '"""', "`", "\\", "\n", "\r\n", "\t", " ", "@", "://", "-u ", "-p", "--token ",
        "machine ", "login ", "(", ")", "[", "]", "{", "}", "${", "$(", "%s", "#", "//", ";", ",", "&", "?",
        "-----BEGIN RSA PRIVATE KEY-----", "-----END", "Private-Lines: 2\n", "kind: Secret\ndata:\n  ",
        "|\n", "\x00", "\udcff", "\ud800", "é", "İ", "ß", "AKIA", "ghp_", "eyJ", "sk-", "x" * 30, "Ab1" * 9,
        "[REDACTED:x]", "mysql ", "docker login ", ":5432:", "*:*:", "<password>", "</password>", "value=",
    ]  # fmt: skip
    for _ in range(3_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        result = redact(text)
        assert isinstance(result.text, str) and isinstance(result.kinds, tuple)
