"""Client-side channels with Vigil's message limits."""

from __future__ import annotations

import grpc

from rpc.server import MAX_MESSAGE_BYTES

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
]


def aio_channel(address: str) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` (host:port)."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def sync_channel(address: str) -> grpc.Channel:
    """A blocking channel to ``address`` (host:port)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
