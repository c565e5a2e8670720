"""The served-prompt record: built by the serving rule, JSON both ways with the configured defaults,
made safe to store, and read back by the trainer with the ids it was served."""

from __future__ import annotations

import json

from context.boundary import cursor_context
from context.config import CompletionConfig
from context.prompt_record import ReferenceIdentity, ServedPrompt, TokenizerCodec

RECORD = ServedPrompt(
    ids=(1, 2, 3), text="def f():\n    ", heal="\n    ", start=40, line_suffix="", following_lines=("x = 1",),
    prefix_tokens=64, max_lines=3, finish_tokens=0, max_tokens=8, stop=("\n\n\n", "```"), dropped_tokens=1,
    references=(ReferenceIdentity("abc123", "/w/util.py", 120),), reference_tokens=150,
)


def test_a_record_goes_to_json_and_back_unchanged():
    data = json.loads(json.dumps(RECORD.to_json()))
    assert ServedPrompt.from_json(data) == RECORD
    # Stored without its window (an episode keeps that as its prompt_text), it is given back.
    bare = RECORD.to_json(with_text=False)
    assert "text" not in bare and ServedPrompt.from_json(bare, text=RECORD.text) == RECORD


def test_missing_settings_take_the_configured_defaults():
    defaults = CompletionConfig()
    record = ServedPrompt.from_json({"text": "x = "})
    assert record.ids is None and record.references == ()
    assert (record.prefix_tokens, record.max_lines, record.finish_tokens, record.max_tokens) == (
        defaults.prefix_tokens, defaults.max_lines, defaults.finish_tokens, defaults.max_tokens)
    assert ServedPrompt.from_text("x = ", max_lines=2).max_lines == 2


def test_storage_keeps_the_ids_only_with_the_window_unredacted():
    def redact(text: str) -> str:
        return text.replace("hunter2", "[REDACTED:password]")

    assert RECORD.for_storage(redact) == RECORD  # nothing to redact: kept as served
    secret = ServedPrompt(ids=(5, 6), text='password = "hunter2"\n', following_lines=("# hunter2 again",),
                          references=(ReferenceIdentity("h", "/w/hunter2.py", 3),))
    stored = secret.for_storage(redact)
    assert stored.ids is None and stored.text == 'password = "[REDACTED:password]"\n'
    assert stored.following_lines == ("# [REDACTED:password] again",)
    assert stored.references[0].path == "/w/[REDACTED:password].py"
    hashed = RECORD.for_storage(redact, keep_code=False)  # storage "hashed"/"none": no code at all
    assert hashed.ids is None and hashed.text == "" and hashed.following_lines == ()
    assert hashed.prefix_tokens == 64 and hashed.references == RECORD.references


def test_the_served_ids_are_read_back_and_text_without_them_is_tokenized_by_the_same_rule(runtime):
    codec = TokenizerCodec(runtime.tokenizer)
    text = "import os\n\n\ndef main():\n    path = os.getcwd()\n    "
    config = CompletionConfig(prefix_tokens=8)
    served = ServedPrompt.build(runtime, cursor_context(text, len(text), 8), config)
    assert len(served.ids) == 7 and served.heal == "\n    " and served.text == text[served.start:]
    assert served.model_ids(codec) == (list(served.ids), served.heal)
    # No ids (redacted, or an old episode): the window is tokenized again by the serving rule.
    assert ServedPrompt.from_text(text, prefix_tokens=8).model_ids(codec) == (list(served.ids), served.heal)
    # Ids another tokenizer made do not spell the window: they are not trusted.
    foreign = ServedPrompt(ids=(1, 2, 3), text=served.text, heal=served.heal, prefix_tokens=8)
    assert foreign.model_ids(codec) == (list(served.ids), served.heal)


def test_the_cursor_context_is_the_one_the_boundary_rules_saw():
    text = "values = compute(a, b)\nprint(values)\n"
    offset = text.index("(a") + 1
    ctx = cursor_context(text, offset, 8)
    served = ServedPrompt(ids=None, text=ctx.prefix, line_suffix=ctx.line_suffix,
                          following_lines=ctx.following_lines)
    assert served.cursor_context() == ctx


def test_reference_texts_stay_out_of_the_json_and_come_back_by_hash():
    with_texts = ServedPrompt(
        ids=(1,), text="x", references=(ReferenceIdentity("h1", "/w/a.py", 3, "a = 1\n"),
                                        ReferenceIdentity("h2", "/w/b.py", 2, 'key = "hunter2"\n')),
        reference_tokens=20, reference_prefix="p0", reference_recovery=(("first_k", 32), ("following", None)),
    )
    data = json.loads(json.dumps(with_texts.to_json()))
    assert [set(ref) for ref in data["references"]] == [{"hash", "path", "tokens"}] * 2
    assert data["reference_recovery"] == {"first_k": 32, "following": None}
    back = ServedPrompt.from_json(data)
    assert [ref.text for ref in back.references] == [None, None]
    assert back.reference_recovery == with_texts.reference_recovery and back.reference_prefix == "p0"
    assert back.with_texts({"h1": "a = 1\n", "h2": 'key = "hunter2"\n'}) == with_texts
    assert back.with_texts({"h1": "a = 1\n"}).references[1].text is None  # not stored: not known

    stored = with_texts.for_storage(lambda text: text.replace("hunter2", "[REDACTED:password]"))
    assert [ref.text for ref in stored.references] == ["a = 1\n", 'key = "[REDACTED:password]"\n']
    assert [ref.text for ref in with_texts.for_storage(str, keep_code=False).references] == [None, None]
