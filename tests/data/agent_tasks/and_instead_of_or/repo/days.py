def is_weekend(day):
    return day == "sat" and day == "sun"
