"""`coopsched serve`'s listening socket: every connection asyncio accepts on it has TCP_NODELAY.

Without it (a socket made with protocol 0, which asyncio does not recognise as TCP) a keep-alive
client waited 44 ms for every response after its first: the body sat behind the headers until the
client's delayed ACK. The option is read off the accepted connection, so no time is measured.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from coopsched.server.cli import listening_socket


def accepted_nodelay(sock: socket.socket) -> int:
    """TCP_NODELAY of a connection that an asyncio server on `sock` (bound, listening) accepts."""
    async def main() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        def connected(reader, writer) -> None:
            seen.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(connected, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            value = await asyncio.wait_for(seen, timeout=10)
            writer.close()
            return value
    return asyncio.run(main())


def bound(sock: socket.socket) -> socket.socket:
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_connections_accepted_on_the_servers_socket_have_nodelay():
    with bound(listening_socket("127.0.0.1")) as sock:
        assert sock.proto == socket.IPPROTO_TCP
        assert accepted_nodelay(sock) != 0


def test_the_check_fails_on_a_socket_made_with_protocol_0():
    """The socket the server made before: asyncio leaves its connections to Nagle."""
    with bound(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        if sock.proto == socket.IPPROTO_TCP:  # a platform that fills the protocol in itself
            pytest.skip("this platform reports protocol 0 sockets as IPPROTO_TCP")
        assert accepted_nodelay(sock) == 0
