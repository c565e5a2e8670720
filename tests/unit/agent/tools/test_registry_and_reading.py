"""The tool registry (schemas, validation, failures reported) and the reading tools."""

from __future__ import annotations

import os

from agent.tools import ALL_TOOLS, Tool, ToolRegistry, ToolResult, default_registry


def test_every_tool_has_an_object_schema_and_is_registered():
    registry = default_registry()
    assert registry.names() == [t.name for t in ALL_TOOLS]
    assert {
        "read_file",
        "search",
        "grep",
        "symbols",
        "lint",
        "edit",
        "run_tests",
        "pr_history",
        "memory",
    } <= set(registry.names())
    for schema in registry.schemas():
        assert schema["type"] == "function"
        assert schema["function"]["parameters"]["type"] == "object"


def test_unknown_tools_and_bad_arguments_are_reported_not_raised(ctx):
    registry = default_registry()
    unknown = registry.call(ctx, "rm_rf", {})
    assert not unknown.ok and "unknown tool 'rm_rf'" in unknown.output and "read_file" in unknown.output
    assert "missing required argument(s): path" in registry.call(ctx, "read_file", {}).output
    assert "must be integer" in registry.call(ctx, "read_file", {"path": "calc.py", "start": "x"}).output
    assert (
        "unknown argument(s): paht" in registry.call(ctx, "read_file", {"path": "calc.py", "paht": 1}).output
    )
    assert "must be a JSON object" in registry.call(ctx, "read_file", ["calc.py"]).output
    assert not registry.call(ctx, None, {}).ok


def test_a_tool_that_crashes_is_reported(ctx):
    def broken(_ctx, _args):
        raise RuntimeError("boom")

    registry = ToolRegistry([Tool("broken", "", {"type": "object", "properties": {}}, broken)])
    result = registry.call(ctx, "broken", {})
    assert not result.ok and "RuntimeError: boom" in result.output


def test_read_file_shows_a_numbered_window_with_what_is_around(ctx, project):
    (project / "long.py").write_text("".join(f"x{i} = {i}\n" for i in range(1, 251)))
    result = default_registry().call(ctx, "read_file", {"path": "long.py", "start": 101})
    assert result.ok
    header, *lines = result.output.splitlines()
    assert header == "long.py: 250 lines, showing 101-200 (100 above, 50 below)"
    assert lines[0].split() == ["101", "x101", "=", "101"] and len(lines) == 100


def test_read_file_outside_the_workspace_or_missing_fails_cleanly(ctx, project, tmp_path):
    (tmp_path / "outside.py").write_text("x = 1\n")
    os.symlink(tmp_path / "outside.py", project / "sneaky.py")
    registry = default_registry()
    for path in ("../outside.py", "sneaky.py", "/etc/hostname"):
        result = registry.call(ctx, "read_file", {"path": path})
        assert not result.ok and "outside the workspace" in result.output
    missing = registry.call(ctx, "read_file", {"path": "nope.py"})
    assert not missing.ok and "does not exist" in missing.output


def test_read_file_sees_the_overlay(ctx):
    path = ctx.workspace.resolve("calc.py")
    ctx.overlay.write(path, "changed = True\n")
    assert "changed = True" in default_registry().call(ctx, "read_file", {"path": "calc.py"}).output


def test_grep_lists_all_hits_or_asks_to_narrow(ctx, project):
    registry = default_registry()
    hits = registry.call(ctx, "grep", {"pattern": r"def \w+"})
    assert hits.ok and hits.data["hits"] == 4
    assert "calc.py:4: def add(a, b):" in hits.output
    (project / "many.py").write_text("value = 1\n" * 100)
    many = registry.call(ctx, "grep", {"pattern": "value = "})
    assert "100 matches in 1 files: too many to list" in many.output and "many.py: 100 hits" in many.output
    assert "bad regular expression" in registry.call(ctx, "grep", {"pattern": "("}).output
    assert registry.call(ctx, "grep", {"pattern": "zzz_nothing"}).output.startswith("no match")


def test_search_and_symbols_use_the_real_index(ctx, project, tmp_path):
    from context.index.indexer import Indexer
    from context.index.store import IndexStore

    store = IndexStore(tmp_path / "index.sqlite")
    Indexer([project], store).index_all()
    ctx.store = store
    registry = default_registry()
    found = registry.call(ctx, "search", {"query": "average of values"})
    assert found.ok and "calc.py" in found.output and "mean" in found.output
    symbols = registry.call(ctx, "symbols", {"name": "add"})
    assert "calc.py:4-5 function def add(a, b):" in symbols.output
    assert "test_calc.py:" in symbols.output  # the test calls add
    store.close()


def test_search_without_an_index_says_so(ctx):
    result = default_registry().call(ctx, "search", {"query": "x"})
    assert not result.ok and "index is not available" in result.output


def test_tool_result_defaults():
    assert ToolResult(True, "x").data == {}
