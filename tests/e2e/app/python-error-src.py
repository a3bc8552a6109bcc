ok = True


def f(:
    pass
