from days import is_weekend


def test_saturday():
    assert is_weekend("sat")


def test_monday():
    assert not is_weekend("mon")
