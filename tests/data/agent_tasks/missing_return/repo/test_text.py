from text import normalize


def test_normalize():
    assert normalize("  Hello   World ") == "hello world"
