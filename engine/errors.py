class NinferError(Exception):
    """An error the user can act on: its message is one sentence saying what is wrong and what to do.

    The CLI prints it on one line and exits with code 2; the server maps it to a 4xx.
    """


class EngineOverloaded(NinferError):
    """The admission queue is full (the server answers 429 / Anthropic 529 overloaded_error)."""
