"""Secret redaction on a corpus of realistic (fake) credential formats, and the storage modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedback.redact import for_storage, redact, text_hash

CORPUS = json.loads((Path(__file__).parents[2] / "data" / "secrets_corpus.json").read_text())


@pytest.mark.parametrize("case", CORPUS["secrets"], ids=[c["kind"] for c in CORPUS["secrets"]])
def test_every_secret_format_is_redacted_and_the_code_around_it_kept(case):
    result = redact(case["text"])
    assert case["secret"] not in result.text
    assert "[REDACTED:" in result.text and result.kinds
    assert result.text.startswith("def configure():\n") and result.text.endswith("    return True\n")


@pytest.mark.parametrize("text", CORPUS["clean"])
def test_ordinary_code_is_left_alone(text):
    assert redact(text).text == text


def test_this_repositorys_own_code_is_not_redacted():
    root = Path(__file__).parents[3]
    for path in [
        root / "agent" / "completion.py",
        root / "context" / "config.py",
        root / "lsp_server" / "server.py",
    ]:
        text = path.read_text()
        assert redact(text).kinds == (), path


def test_url_redaction_keeps_the_shape():
    text = 'url = "postgresql://app:s3cr3tP4ss@db:5432/app"'
    assert redact(text).text == 'url = "postgresql://app:[REDACTED:url_password]@db:5432/app"'


@pytest.mark.parametrize(
    ("mode", "keeps_text", "keeps_hash"),
    [("full", True, True), ("hashed", False, True), ("none", False, False)],
)
def test_storage_modes(mode, keeps_text, keeps_hash):
    raw = 'key = "AKIAABCDEFGHIJKLMNOP"\nx = 1\n'
    text, digest = for_storage(raw, mode)
    assert (text is not None) == keeps_text and (digest is not None) == keeps_hash
    if keeps_text:
        assert "AKIA" not in text
    if keeps_hash:
        # The hash is of the redacted text: it cannot be used to test guesses of the secret.
        assert digest == text_hash(redact(raw).text) != text_hash(raw)
