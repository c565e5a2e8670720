from users import is_admin


def test_built_name():
    assert is_admin("".join(["AD", "MIN"]))


def test_other():
    assert not is_admin("guest")
