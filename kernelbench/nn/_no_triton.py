"""Stand-ins for ``triton`` when it is not installed: kernel definitions still import (their
decorator returns the function unchanged) and the Triton paths report "triton not installed"."""


class _MissingTriton:
    available = False

    @staticmethod
    def jit(fn):
        return fn


triton = _MissingTriton()
tl = None
