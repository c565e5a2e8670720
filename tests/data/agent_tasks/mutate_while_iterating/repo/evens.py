def remove_evens(numbers):
    """`numbers` without its even members."""
    for n in numbers:
        if n % 2 == 0:
            numbers.remove(n)
    return numbers
