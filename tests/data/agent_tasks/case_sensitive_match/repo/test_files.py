from files import has_extension


def test_upper_case():
    assert has_extension("MAIN.PY", ".py")


def test_other():
    assert not has_extension("main.rs", ".py")
