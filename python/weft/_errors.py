# _errors.py - the exceptions of the package. Every failure of a weft call
# is a WeftError carrying the status name and weft_last_error's sentence
# (which names rank, call and peer); a few statuses get a subclass that also
# derives from the matching built-in exception, so `except ValueError` or
# `except TimeoutError` do what a Python user expects.


class WeftError(Exception):
    """A weft call failed. `status` is the status name ("WEFT_ERR_PEER_LOST"),
    `code` its value in weft.h, `message` the library's sentence."""

    def __init__(self, status, message, code=None):
        super().__init__("%s: %s" % (status, message) if message else status)
        self.status = status
        self.code = code
        self.message = message


class InvalidArgument(WeftError, ValueError):
    """A bad argument, refused before anything was sent (or by the library
    with WEFT_ERR_INVALID)."""

    def __init__(self, message, status="WEFT_ERR_INVALID", code=-1):
        super().__init__(status, message, code)


class InvalidDtype(InvalidArgument, TypeError):
    """A buffer whose element type weft does not take, or send and receive
    buffers of different types."""


class PeerLost(WeftError, ConnectionError):
    """WEFT_ERR_PEER_LOST: a peer died, closed its connection or failed."""


class Timeout(WeftError, TimeoutError):
    """WEFT_ERR_TIMEOUT: no progress from a peer within the timeout."""


class Aborted(WeftError):
    """WEFT_ERR_ABORTED: the communicator was aborted or destroyed."""


class Revoked(WeftError):
    """WEFT_ERR_REVOKED: the communicator was revoked (by a rank, or by a
    recovery that counted this rank lost); recover with shrink()."""


class Mismatch(WeftError):
    """WEFT_ERR_MISMATCH: ranks called a collective with different arguments."""


_BY_STATUS = {
    "WEFT_ERR_PEER_LOST": PeerLost,
    "WEFT_ERR_TIMEOUT": Timeout,
    "WEFT_ERR_ABORTED": Aborted,
    "WEFT_ERR_REVOKED": Revoked,
    "WEFT_ERR_MISMATCH": Mismatch,
}


def from_status(status, message, code):
    if status == "WEFT_ERR_INVALID":
        return InvalidArgument(message, status, code)
    return _BY_STATUS.get(status, WeftError)(status, message, code)
