"""Exceptions chosen by the library's status names: every status the
library has gets its family's class with the library's number, the
families cover only statuses the library has, and a real failing call
(an option the library refuses) raises the class its name says."""

from __future__ import annotations

import pytest

import quorum
from quorum._native import STATUS, lib
from quorum.errors import BY_NAME, error_for


def test_every_status_of_the_library() -> None:
    assert STATUS["QR_OK"] == 0 and len(STATUS) > 1
    for name, code in STATUS.items():
        assert lib.qr_status_name(code).decode() == name
        e = error_for(code, name, "message")
        assert type(e) is BY_NAME.get(name, quorum.QuorumError)
        assert (e.status, e.status_name, str(e)) == (code, name, "message")
    assert set(BY_NAME) <= set(STATUS)


def test_families() -> None:
    assert isinstance(error_for(STATUS["QR_EINVAL"], "QR_EINVAL", ""), ValueError)
    assert isinstance(error_for(STATUS["QR_ETIMEDOUT"], "QR_ETIMEDOUT", ""), TimeoutError)
    assert isinstance(error_for(STATUS["QR_EAUTH"], "QR_EAUTH", ""), PermissionError)
    assert isinstance(error_for(STATUS["QR_EROLLEDBACK"], "QR_EROLLEDBACK", ""),
                      quorum.StoppedError)
    assert isinstance(error_for(STATUS["QR_ESTALE"], "QR_ESTALE", ""), quorum.StaleError)
    assert type(error_for(STATUS["QR_EIO"], "QR_EIO", "")) is quorum.QuorumError
    plain = quorum.QuorumError("no status given")
    assert (plain.status, plain.status_name) == (STATUS["QR_EINTERNAL"], "QR_EINTERNAL")


def test_a_refused_option() -> None:
    # The optimizer names are the optimizer table's, given to the option
    # table when the library is loaded.
    with pytest.raises(quorum.InvalidArgumentError) as e:
        quorum.Config(optimizer="adamax")
    assert e.value.status == STATUS["QR_EINVAL"] and e.value.status_name == "QR_EINVAL"
    assert "not one of sgd|momentum|adagrad|rmsprop|adam|adam_async|ftrl" in str(e.value)
    assert quorum.Config().get("optimizer") == "sgd"
