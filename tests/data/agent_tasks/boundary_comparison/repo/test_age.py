from age import is_adult


def test_eighteen():
    assert is_adult(18)


def test_child():
    assert not is_adult(17)
