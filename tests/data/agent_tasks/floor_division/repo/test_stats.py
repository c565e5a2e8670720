from stats import average


def test_fractional_average():
    assert average([1, 2]) == 1.5


def test_empty():
    assert average([]) == 0.0
