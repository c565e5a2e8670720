from pages import page_count


def test_partial_last_page():
    assert page_count(list(range(10)), 3) == 4


def test_exact_pages():
    assert page_count(list(range(9)), 3) == 3
