"""The task bank's one error."""

from __future__ import annotations

from farmd.errors import FarmError


class TaskBankError(FarmError, ValueError):
    """The bank was asked something invalid: an unknown environment, a difficulty out of range,
    a reward outside [0, 1], a setting out of range, or saved state it cannot read.
    """
