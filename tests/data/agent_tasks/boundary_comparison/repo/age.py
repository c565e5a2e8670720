ADULT_AGE = 18


def is_adult(age):
    return age > ADULT_AGE
