"""The edit fallback's search text decoded as a copy of the file (`agent.copy_search`): with the
embedded model's real vocabulary, and through the real runtime's greedy and batched decoding."""

from __future__ import annotations

from agent.copy_search import CopySearch, copy_vocabulary

SOURCE = '''def add(a, b):
    """Sum."""
    return a - b


def sub(a, b):
    return a - b
'''
LINE_STARTS = (0, *(i + 1 for i, char in enumerate(SOURCE) if char == "\n"))


def _copies(text: str) -> bool:
    """`text` is a piece of SOURCE that starts at a line start."""
    return any(SOURCE.startswith(text, start) for start in LINE_STARTS)


def _texts(runtime, ids) -> set[str]:
    return {runtime.token_texts()[i] for i in ids}


def test_only_the_files_text_from_a_line_start_may_follow(runtime):
    copy = CopySearch(SOURCE, copy_vocabulary(runtime.token_texts()))
    first = _texts(runtime, copy(""))
    assert "def" in first and all(_copies(token) for token in first)
    assert not any(token.startswith("lines") for token in first)  # the protocol's placeholder is not there
    inside = _texts(runtime, copy("    return a "))
    assert "-" in inside and all(_copies("    return a " + token) for token in inside)
    # The section may close after whole lines found at one place only: not mid-line, and not after
    # `return a - b`, which stands in both functions (the edit would not know where to apply).
    closes = lambda text: any(token.startswith("=") for token in _texts(runtime, copy(text)))  # noqa: E731
    assert closes('    """Sum."""\n') and closes('    """Sum."""\n    return a - b\n')
    assert not closes("    return a - b\n") and not closes('    """Sum')
    assert not any(t.strip() == "" for t in _texts(runtime, copy("")) if "\n" in t)  # no blank first line
    # In the replacement a line may start with anything but a marker, unless it is the closing one.
    after = '    """Sum."""\n=======\n'
    line_start = _texts(runtime, copy(after))
    assert "    " in line_start and "=" not in line_start and not any(t.startswith("<") for t in line_start)
    closing = {t for t in line_start if t.startswith(">")}
    assert closing and all(">>>>>>> REPLACE\n".startswith(t) for t in closing)
    assert all(">>>>>>> REPLACE\n".startswith(">>" + t) for t in _texts(runtime, copy(after + ">>")))
    assert copy(after + "    x") is None  # inside a line: free
    assert copy(after + ">>>>>>> REPLACE\n") is None  # closed: free
    # Text that is not in the file frees the model (nothing it could copy).
    assert copy("lines copied exactly") is None


def test_with_the_lines_asked_about_the_copy_starts_among_them(runtime):
    # Lines 6-7 are `sub`: the search text starts there, not in `add`.
    vocabulary = copy_vocabulary(runtime.token_texts())
    copy = CopySearch(SOURCE, vocabulary, (6, 7))
    first = _texts(runtime, copy(""))
    assert first and all(any(SOURCE.startswith(t, start) for start in LINE_STARTS[5:7]) for t in first)
    assert copy('    """Sum') is None  # a line of `add`: nothing to copy from there
    assert "-" in _texts(runtime, copy("    return a "))
    # Lines 1-3 are `add`: `    return a - b`, which stands in both functions, still may not close
    # the section alone (the edit would not know where to apply), and the copy goes on past it.
    copy = CopySearch(SOURCE, vocabulary, (1, 3))
    assert not any(t.startswith("def s") for t in _texts(runtime, copy("")))
    after_return = _texts(runtime, copy("    return a - b\n"))
    assert after_return and not any(t.startswith("=") for t in after_return)
    assert any(t.startswith("=") for t in _texts(runtime, copy('    """Sum."""\n')))
    # Lines with nothing in them, or past the file's end, leave the whole file to copy from.
    for lines in ((4, 5), (40, 50)):
        assert {"def"} <= _texts(runtime, CopySearch(SOURCE, vocabulary, lines)(""))
        assert CopySearch(SOURCE, vocabulary, lines)("def sub") is not None


def test_greedy_and_batched_decoding_copy_the_file(runtime):
    from agent.backends import Conversation, LocalBackend

    ask = [{"role": "user", "content": "add() subtracts; fix it"}]
    conversation = Conversation("You fix bugs.", messages=ask, prefill="edit calc.py\n<<<<<<< SEARCH\n",
                                copy_from=SOURCE)
    backend = LocalBackend(runtime)
    for k, temperature in ((1, 0.0), (3, 0.8)):
        for sample in backend.sample(conversation, k, temperature=temperature, max_tokens=48, seed=3):
            search = sample.text.split("<<<<<<< SEARCH\n", 1)[1].split("=======", 1)[0]
            assert search and _copies(search), sample.text


def test_a_constrained_copy_keeps_prompt_lookup_drafts_and_the_greedy_output(runtime):
    # The file is in the prompt, so the copy is drafted from it; each drafted token is kept only
    # where the constraint's masked argmax picks it.
    import dataclasses

    from agent.backends import Conversation, LocalBackend

    ask = [{"role": "user", "content": f"calc.py:\n```python\n{SOURCE}```\nadd() subtracts; fix it"}]
    conversation = Conversation("You fix bugs.", messages=ask, prefill="edit calc.py\n<<<<<<< SEARCH\n",
                                copy_from=SOURCE)
    backend = LocalBackend(runtime)
    before = runtime.config
    results = {}
    try:
        for drafts in (0, 10):
            runtime.config = dataclasses.replace(before, draft_tokens=drafts)
            runtime.forget_prefix()
            (sample,) = backend.sample(conversation, 1, temperature=0.0, max_tokens=40)
            results[drafts] = (sample.text, backend.last_results[0])
    finally:
        runtime.config = before
    (plain, plain_result), (drafted, drafted_result) = results[0], results[10]
    assert plain_result.drafted_tokens == 0 and drafted_result.accepted_tokens > 0
    assert drafted == plain
    search = drafted.split("<<<<<<< SEARCH\n", 1)[1].split("=======", 1)[0]
    assert search and _copies(search), drafted


def test_an_edit_block_the_model_opens_for_the_file_is_a_copy_and_the_rest_is_free(runtime):
    from agent.copy_search import EditCopy

    copy = EditCopy("pkg/calc.py", SOURCE, copy_vocabulary(runtime.token_texts()))
    assert copy("") is None and copy("tool\n{") is None and copy("edit pkg/calc.py\n") is None
    for header in ("edit pkg/calc.py", "edit calc.py", "edit", "edit PATH"):
        opened = _texts(runtime, copy(f"{header}\n<<<<<<< SEARCH\n    return a "))
        assert opened and all(_copies("    return a " + t) for t in opened)
    assert copy("edit other.py\n<<<<<<< SEARCH\n") is None  # another file: nothing to copy from
    closed = "edit calc.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n"
    assert copy(closed) is None
    second = _texts(runtime, copy(closed + "<<<<<<< SEARCH\n"))
    assert second and all(_copies(t) for t in second if "\n" not in t)


def test_with_copy_search_the_loop_gives_the_backend_the_file_asked_about(project):
    from agent.backends import LocalBackend
    from agent.loop import AgentLoop, AgentRequest
    from agent.sandbox import Workspace
    from context.config import AgentConfig

    class Runtime:  # a stand-in: the conversation is built before anything is generated
        pass

    backend = LocalBackend(Runtime())
    for copy_search, expected in ((True, ("calc.py", (project / "calc.py").read_text())), (False, None)):
        loop = AgentLoop(backend, Workspace([project]), AgentConfig(pretest=False, copy_search=copy_search))
        conversation = loop.first_conversation(AgentRequest("fix add", project / "calc.py"))
        assert conversation.edit_source == expected
    asked = loop.first_conversation(AgentRequest("fix add", project / "calc.py", line_range=(1, 2)))
    assert asked.copy_lines == (1, 2)
