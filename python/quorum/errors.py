"""Exceptions: one class per family of the C library's status codes, each
carrying the library's own message (what failed and why) and the status.

Every class derives from QuorumError; the ones with a natural Python
counterpart derive from it too, so ``except ValueError`` or ``except
TimeoutError`` catch what a Python programmer expects them to catch."""

from __future__ import annotations

from typing import Dict, Type


class QuorumError(RuntimeError):
    """A call into quorum failed. ``status`` is the C status code (negative),
    ``status_name`` its symbolic name ("QR_EINVAL")."""

    def __init__(self, message: str, status: int = -16, status_name: str = "QR_EINTERNAL"):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class InvalidArgumentError(QuorumError, ValueError):
    """A bad argument, option, shape or id (QR_EINVAL, QR_ESHAPE, QR_ENOTFOUND,
    QR_EEXIST, QR_ENONFINITE, QR_ETOOBIG)."""


class StaleError(QuorumError):
    """Sync mode: the gradients were for a step that is over; they were dropped
    (QR_ESTALE). Take a token and go on."""


class StoppedError(QuorumError):
    """The cluster stopped, or aborted, or rolled back to a checkpoint
    (QR_ESTOPPED, QR_EABORTED, QR_EROLLEDBACK)."""


class QuorumTimeoutError(QuorumError, TimeoutError):
    """A peer did not answer in time, or was lost and did not come back
    (QR_ETIMEDOUT, QR_EPEERLOST, QR_ENOTREADY)."""


class AuthenticationError(QuorumError, PermissionError):
    """A connection's handshake was refused (QR_EAUTH): the tasks hold
    different secrets or cluster specs, one has a secret and the other none,
    or one encrypts and the other does not. The message says which."""


_BY_STATUS: Dict[int, Type[QuorumError]] = {
    -1: InvalidArgumentError,   # QR_EINVAL
    -5: InvalidArgumentError,   # QR_ENOTFOUND
    -6: InvalidArgumentError,   # QR_EEXIST
    -7: InvalidArgumentError,   # QR_ESHAPE
    -14: InvalidArgumentError,  # QR_ENONFINITE
    -15: InvalidArgumentError,  # QR_ETOOBIG
    -8: QuorumTimeoutError,     # QR_ETIMEDOUT
    -9: QuorumTimeoutError,     # QR_EPEERLOST
    -11: QuorumTimeoutError,    # QR_ENOTREADY
    -10: StoppedError,          # QR_ESTOPPED
    -13: StoppedError,          # QR_EABORTED
    -17: StoppedError,          # QR_EROLLEDBACK
    -12: StaleError,            # QR_ESTALE
    -18: AuthenticationError,   # QR_EAUTH
}


def error_for(status: int, status_name: str, message: str) -> QuorumError:
    """The exception for a C status and its message."""
    cls = _BY_STATUS.get(status, QuorumError)
    return cls(message, status, status_name)
