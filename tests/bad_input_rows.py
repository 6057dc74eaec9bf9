"""The row format of the bad-input tables (tests/test_bad_inputs*.py): a call, the error it must raise and words
its message must hold (the argument, the value received, what is allowed)."""

from __future__ import annotations

import pytest


def row(row_id: str, call, words: list[str], error: type[Exception] = ValueError):
    return pytest.param(call, error, words, id=row_id)


def assert_rejects(call, error: type[Exception], words: list[str]) -> None:
    """``call()`` raises ``error`` and its message holds every one of ``words``."""
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    missing = [word for word in words if word not in message]
    assert not missing, f"{missing} not in the message: {message}"
