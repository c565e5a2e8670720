from evens import remove_evens


def test_consecutive_evens():
    assert remove_evens([1, 2, 4, 5]) == [1, 5]
