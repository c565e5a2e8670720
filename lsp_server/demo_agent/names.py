def full_name(first, last):
    return f"{first} {first}"
