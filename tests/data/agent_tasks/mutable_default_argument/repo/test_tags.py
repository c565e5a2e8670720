from tags import add_tag


def test_separate_calls():
    assert add_tag("a") == ["a"]
    assert add_tag("b") == ["b"]


def test_given_list():
    assert add_tag("b", ["a"]) == ["a", "b"]
