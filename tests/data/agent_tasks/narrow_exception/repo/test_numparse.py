from numparse import parse_int


def test_not_a_number():
    assert parse_int("x") is None


def test_number():
    assert parse_int("42") == 42
