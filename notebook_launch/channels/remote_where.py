"""The format of asking a rank on another machine where it is (a Ray or SLURM rank), which both
sides use: the notebook writes requests and reads replies (``diagnose.remote_where``), the rank's answerer
reads requests and writes replies (``rank.reports.remote_where``). Here so that neither side reads the
other's module for it, as the local request's format is in ``channels.where_request``.

A request frame is a ``sockets.SIGNAL_FRAME`` on the rank's events connection whose value is
``REQUEST_BASE`` + the request's number: signal numbers are far below it, and its first byte is
0, which no persistent message's kind is (``channels.remote_commands``). A reply, on the rank's
answers connection, is ``REPLY`` (magic, the request's number, the body's length) and a
zlib-compressed JSON object.
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from .sockets import SIGNAL_FRAME

REQUEST_BASE = 1 << 23      # request frames: REQUEST_BASE + number (mod REQUEST_BASE); first byte 0
REPLY = struct.Struct("!4sIQ")   # magic, request number, body length
REPLY_MAGIC = b"NLWR"


def request_frame(number: int) -> bytes:
    """The 4 bytes that ask a remote rank where it is (``number`` names the request)."""
    return SIGNAL_FRAME.pack(REQUEST_BASE + number % REQUEST_BASE)


def request_number(value: int) -> int | None:
    """The request's number if a frame's value is a where request, else None (a signal)."""
    return value - REQUEST_BASE if REQUEST_BASE <= value < 2 * REQUEST_BASE else None


def encode_reply(number: int, payload: dict[str, Any]) -> bytes:
    body = zlib.compress(json.dumps(payload).encode("utf-8"))
    return REPLY.pack(REPLY_MAGIC, number % (1 << 32), len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    data = json.loads(zlib.decompress(body).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("a where reply's body is not an object")
    return data
