"""Exceptions raised by graphtrain (the C++ engine raises these too)."""


class GraphtrainError(RuntimeError):
    """Base of every error graphtrain raises."""


class OptionError(GraphtrainError, ValueError):
    """A runtime option got a value it cannot accept; the message names the variable and value."""


class GraphError(GraphtrainError):
    """A graph is malformed or uses something graphtrain cannot run (the message names the node)."""


class ModelFileError(GraphtrainError):
    """A model file cannot be read or written (truncated, corrupted, missing external data)."""


class InputError(GraphtrainError, ValueError):
    """Inputs given at run time do not match the graph (name, element type, rank or a dim)."""


class UnsupportedModelError(GraphtrainError):
    """GraphModule cannot run this model in the engine; the message names the ATen op, the module
    and the source line, and says how to fall back to plain PyTorch."""
