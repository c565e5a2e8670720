from words import count_words


def test_counts():
    assert count_words("a b a") == {"a": 2, "b": 1}
