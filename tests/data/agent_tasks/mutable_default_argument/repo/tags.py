def add_tag(tag, tags=[]):
    """Return `tags` with `tag` appended (a new list when none is given)."""
    tags.append(tag)
    return tags
