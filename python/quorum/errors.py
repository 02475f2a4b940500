"""Exceptions: one class per family of the C library's status codes, each
carrying the library's own message (what failed and why) and the status.
A status is known here by its name ("QR_EINVAL"), which the library gives
(qr_status_name); its number is the library's too (_native.STATUS).

Every class derives from QuorumError; the ones with a natural Python
counterpart derive from it too, so ``except ValueError`` or ``except
TimeoutError`` catch what a Python programmer expects them to catch."""

from __future__ import annotations

from typing import Dict, Optional, Type


class QuorumError(RuntimeError):
    """A call into quorum failed. ``status`` is the C status code (negative),
    ``status_name`` its symbolic name ("QR_EINVAL"). Without a status, the
    library's number for ``status_name``."""

    def __init__(self, message: str, status: Optional[int] = None,
                 status_name: str = "QR_EINTERNAL"):
        super().__init__(message)
        if status is None:
            # _native imports this module; by the time an error is made it is loaded
            from ._native import STATUS

            status = STATUS[status_name]
        self.status: int = status
        self.status_name = status_name


class InvalidArgumentError(QuorumError, ValueError):
    """A bad argument, option, shape or id (QR_EINVAL, QR_ESHAPE, QR_ENOTFOUND,
    QR_EEXIST, QR_ENONFINITE, QR_ETOOBIG)."""


class StaleError(QuorumError):
    """Sync mode: the gradients were for a step that is over; they were dropped
    (QR_ESTALE). Take a token and go on."""


class StoppedError(QuorumError):
    """The cluster stopped, or aborted, or rolled back to a checkpoint
    (QR_ESTOPPED, QR_EABORTED, QR_EROLLEDBACK), or ended without its chief
    (QR_ECHIEFLOST: worker 0 was lost and not restarted in time)."""


class QuorumTimeoutError(QuorumError, TimeoutError):
    """A peer did not answer in time, or was lost and did not come back
    (QR_ETIMEDOUT, QR_EPEERLOST, QR_ENOTREADY), or a ps refused a request
    of an old view after a failover (QR_EVIEW; the worker retries those
    itself, docs/REPLICATION.md)."""


class AuthenticationError(QuorumError, PermissionError):
    """A connection's handshake was refused (QR_EAUTH): the tasks hold
    different secrets or cluster specs, one has a secret and the other none,
    or one encrypts and the other does not. The message says which."""


# The family of each status, by the library's name for it; any other
# status (QR_EIO, QR_EPROTO, QR_ENOMEM, QR_EINTERNAL) is a plain QuorumError.
BY_NAME: Dict[str, Type[QuorumError]] = {
    "QR_EINVAL": InvalidArgumentError,
    "QR_ENOTFOUND": InvalidArgumentError,
    "QR_EEXIST": InvalidArgumentError,
    "QR_ESHAPE": InvalidArgumentError,
    "QR_ENONFINITE": InvalidArgumentError,
    "QR_ETOOBIG": InvalidArgumentError,
    "QR_ETIMEDOUT": QuorumTimeoutError,
    "QR_EPEERLOST": QuorumTimeoutError,
    "QR_ENOTREADY": QuorumTimeoutError,
    "QR_EVIEW": QuorumTimeoutError,
    "QR_ESTOPPED": StoppedError,
    "QR_EABORTED": StoppedError,
    "QR_EROLLEDBACK": StoppedError,
    "QR_ECHIEFLOST": StoppedError,
    "QR_ESTALE": StaleError,
    "QR_EAUTH": AuthenticationError,
}


def error_for(status: int, status_name: str, message: str) -> QuorumError:
    """The exception for a C status, its name (qr_status_name) and its message."""
    cls = BY_NAME.get(status_name, QuorumError)
    return cls(message, status, status_name)
