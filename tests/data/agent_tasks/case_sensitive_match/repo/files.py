def has_extension(filename, extension):
    """Whether `filename` ends with `extension` (like ".py"), ignoring case."""
    return filename.endswith(extension)
