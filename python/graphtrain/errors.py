"""Exceptions raised by graphtrain (the C++ engine raises these too)."""


class GraphtrainError(RuntimeError):
    """Base of every error graphtrain raises."""


class OptionError(GraphtrainError, ValueError):
    """A runtime option got a value it cannot accept; the message names the variable and value."""
