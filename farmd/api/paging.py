"""Page tokens: opaque to callers, a position in a list to farmd. A token that does not decode is the
caller's error (INVALID_ARGUMENT), never a silent restart from the first page."""

from __future__ import annotations

import base64
import binascii
import json

from farmd.errors import BadRequest

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50
_MAX_TOKEN_CHARS = 200


def page_size(requested: int) -> int:
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def make_token(kind: str, position: int) -> str:
    raw = json.dumps({"k": kind, "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def read_token(kind: str, token: str) -> int | None:
    """The position a token of ``kind`` holds; None for no token (the first page)."""
    if not token:
        return None
    if len(token) > _MAX_TOKEN_CHARS:
        raise BadRequest("page_token is not one this farm gave out")
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        position = data["p"]
        if data["k"] != kind or not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise ValueError(token)
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise BadRequest("page_token is not one this farm gave out (page tokens are opaque: pass back "
                         "next_page_token as it came)") from None
    return position
