class NinferError(Exception):
    """An error the user can act on: its message is one sentence saying what is wrong and what to do.

    The CLI prints it on one line and exits with code 2; the server maps it to a 4xx.
    """


class EngineOverloaded(NinferError):
    """The admission queue is full (the server answers 429 / Anthropic 529 overloaded_error)."""


class DeviceMemoryBusy(NinferError):
    """Waking from sleep found the device's memory taken by another process (the server answers 503)."""


class PromptTooLong(NinferError):
    """A prompt at or beyond the context limit (the server words it as each protocol's clients detect)."""

    def __init__(self, message: str, tokens: int, limit: int):
        super().__init__(message)
        self.tokens, self.limit = tokens, limit
