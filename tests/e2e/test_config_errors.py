"""Bad settings from any layer are shown to the user (window/showMessage, naming the setting and
where it came from) and replaced by a working value; completions keep working."""

from __future__ import annotations

import pytest

from tests.e2e.test_bad_input import (
    SMALL_TEXT,
    end_position,
    inline_items,
    insert_text,
    start_client,
)

pytestmark = pytest.mark.e2e

WARNING = 2


def test_bad_settings_are_reported_and_completions_still_work(model_cache_dir, tmp_path):
    # The user file supplies working values; the layers above it are all broken somewhere.
    client_dir = tmp_path / "client"
    client_dir.mkdir()
    user_config = client_dir / "config-home" / "squidcode" / "config.toml"
    user_config.parent.mkdir(parents=True)
    user_config.write_text("[completion]\nmax_tokens = 6\nprefix_tokens = 128\ndebounce_ms = 0\n")

    broken = tmp_path / "broken-ws"
    broken.mkdir()
    broken_toml = broken / ".squidcode.toml"
    broken_toml.write_text("[completion\nmax_tokens = 8\n")
    out_of_range = tmp_path / "hot-ws"
    out_of_range.mkdir()
    hot_toml = out_of_range / ".squidcode.toml"
    hot_toml.write_text("[completion]\ntemperature = 9.5\n")

    client = start_client(client_dir)
    try:
        client.initialize(
            root=broken,
            folders=[broken, out_of_range],
            options={"completion": {"max_tokens": "lots"}, "colour": "blue"},
        )

        def shown(*words: str) -> dict:
            return client.wait_notification(
                "window/showMessage",
                lambda p: p["type"] == WARNING and all(w in p["message"] for w in words),
                timeout=60,
            )

        shown(str(broken_toml), "not valid TOML")
        shown(str(hot_toml), "'completion.temperature'", "9.5")
        shown("initializationOptions", "'completion.max_tokens'", "'lots'")
        shown("initializationOptions", "'colour'", "unknown setting")
        for message in client.messages_shown():
            assert message.startswith("squidcode configuration: "), message

        # Settings pushed later are validated the same way.
        client.notify(
            "workspace/didChangeConfiguration",
            {"settings": {"squidcode": {"completion": {"temperature": "hot"}}}},
        )
        shown("workspace settings", "'completion.temperature'", "'hot'")

        uri = (broken / "small.py").as_uri()
        client.open(uri, SMALL_TEXT)
        response = client.inline_completion(uri, end_position(SMALL_TEXT), timeout=180)
        items = inline_items(response)
        assert items and insert_text(items[0]).strip(), response
        errors = [n for n in client.notifications if n["method"] == "window/showMessage"
                  and n["params"]["type"] == 1]
        assert errors == [], errors
    finally:
        client.close()
    # The user file's max_tokens (6) was used, not the default 32 the bad option would fall back
    # to on its own: every generation the server logged stopped within 6 new tokens.
    log = (client_dir / "server.stderr.log").read_text(errors="replace")
    generated = [line for line in log.splitlines() if "generated " in line and " tokens after" in line]
    assert generated, log[-2000:]
    for line in generated:
        count = int(line.split("generated ", 1)[1].split(" ", 1)[0])
        assert count <= 6, line
