"""Errors a user can act on.

Every error npurun raises on purpose derives from `NpurunError`; its message names the file,
node, input or field at fault and what was expected. The CLI prints `str(err)` and exits
non-zero, so a message must be complete on one line.
"""


class NpurunError(Exception):
    """Base class of every error npurun raises on purpose."""


class ParseError(NpurunError):
    """Malformed .npuir text; the message carries `file:line:col`."""

    def __init__(self, msg: str, *, file: str = "<text>", line: int = 0, col: int = 0):
        self.file, self.line, self.col = file, line, col
        super().__init__(f"{file}:{line}:{col}: {msg}")


class VerifyError(NpurunError):
    """A graph that breaks an IR invariant; the message names the node and operand."""


class ModelError(NpurunError):
    """A model file that cannot be read or imported (corrupt, truncated, unsupported ops)."""


class InputError(NpurunError):
    """Inputs given to a run that do not match the model (name, shape, dtype)."""


class BackendError(NpurunError):
    """A backend that is unavailable or cannot run a node."""


class PassError(NpurunError):
    """A compiler pass that failed or left an invalid graph; the message names the pass."""


class RegistrationError(NpurunError):
    """An op registration (npurun.register_op) whose spec cannot work; names the op and field."""
