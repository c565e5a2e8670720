def parse_int(text):
    """The integer in `text`, or None when it is not one."""
    try:
        return int(text)
    except TypeError:
        return None
