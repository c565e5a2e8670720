def is_admin(name):
    return name.lower() is "admin"  # noqa: F632
