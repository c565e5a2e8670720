def normalize(text):
    """Lower-case `text` and collapse runs of whitespace into one space."""
    cleaned = " ".join(text.lower().split())
