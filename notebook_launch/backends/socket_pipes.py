"""Moved to ``notebook_launch.channels.sockets`` (the channel types depend on nothing of ours);
this name stays until every import uses the new home."""
from __future__ import annotations

from ..channels.sockets import (HELLO, HELLO_TIMEOUT, SIGNAL_FRAME, STREAMS, TOKEN_BYTES, SocketPipes,
                                StreamListener, connect_streams)

__all__ = ["HELLO", "HELLO_TIMEOUT", "SIGNAL_FRAME", "STREAMS", "TOKEN_BYTES", "SocketPipes",
           "StreamListener", "connect_streams"]
