"""Free UDP port blocks for port-range tests, outside Linux's ephemeral range."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
from pathlib import Path

# Below the kernel's ephemeral ports (32768+), so no other socket takes one by chance.
SEARCH_LOW, SEARCH_HIGH = 20_000, 32_000


def free_port_block(size: int, address: str = "127.0.0.1") -> tuple[int, int]:
    """``(low, high)`` of ``size`` consecutive UDP ports that are free on ``address`` now."""
    for _ in range(100):
        low = random.randrange(SEARCH_LOW, SEARCH_HIGH - size)
        probes: list[socket.socket] = []
        try:
            for port in range(low, low + size):
                probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                probes.append(probe)
                probe.bind((address, port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return low, low + size - 1
    raise RuntimeError(f"no {size} free consecutive UDP ports on {address}")


def udp_ports_bound_here() -> set[tuple[str, int]]:
    """Every ``(address, port)`` a UDP socket of this process is bound to, from /proc (Linux).

    What the kernel says, not what a library reports: a candidate could name one port while
    its socket sits on another.
    """
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    bound = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[9] in inodes:
                address, port = fields[1].split(":")
                bound.add((_address(address), int(port, 16)))
    return bound


def _address(hex_address: str) -> str:
    """An address as /proc/net/udp writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))
