"""Server-side request forgery guard: job targets may not reach private networks.

Checked when a job is created and again at send time (DNS can change in between). At send
time the name is resolved once, every address is checked, and the connection goes to a
checked address (`resolve_pinned`, called by streams/targets.py's PinnedResolver), so a DNS
answer that changes between the check and the connect (rebinding) can't reach a private
address. Redirects are never followed, so a public URL can't bounce into a private one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from streams.domain.errors import PermanentError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host, port) -> every address the name resolves to. Injectable so tests can play DNS.
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

BLOCKED_HOSTNAMES = frozenset({"localhost", "metadata.google.internal", "metadata"})


_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def is_blocked_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Anything not globally routable, including IPv4 tunnelled in IPv6 (mapped,
    IPv4-compatible, 6to4, Teredo, NAT64), which ``is_global`` alone lets through."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded: list[ipaddress.IPv4Address] = []
        if ip.ipv4_mapped is not None:
            embedded.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            embedded.append(ip.sixtofour)
        if ip.teredo is not None:
            embedded.extend(ip.teredo)
        if ip in _V4_COMPATIBLE or any(ip in net for net in _NAT64):
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF))
        if any(is_blocked_ip(v4) for v4 in embedded):
            return True
    return (not ip.is_global or ip.is_private or ip.is_loopback or ip.is_link_local
            or ip.is_multicast or ip.is_reserved or ip.is_unspecified)


def parse_ip(host: str) -> IPAddress | None:
    """Any encoding a resolver accepts: dotted, decimal (2130706433), hex (0x7f.1), octal."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        # inet_aton accepts the legacy forms ("127.1", "0x7f000001", "017700000001").
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str, *, allow_private: bool, resolve: bool = True) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PermanentError("target.url must be an absolute http(s) URL", field="target.url")
    if allow_private:
        return
    host = parts.hostname.rstrip(".").lower()
    if host in BLOCKED_HOSTNAMES or host.endswith(".localhost"):
        raise PermanentError(f"target host {host!r} is private", field="target.url")
    ip = parse_ip(host)
    addresses = [ip] if ip is not None else (_resolve(host) if resolve else [])
    for addr in addresses:
        if is_blocked_ip(addr):
            raise PermanentError(f"target host {host!r} resolves to a private address",
                                 field="target.url")


def _resolve(host: str) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return []
    return [ipaddress.ip_address(info[4][0]) for info in infos]


class BlockedAddress(PermanentError):
    """The target resolved to an address it may not reach; retrying can't help."""


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


async def resolve_pinned(host: str, port: int, *, allow_private: bool,
                         resolver: Resolver = system_resolver) -> list[IPAddress]:
    """The addresses to connect to for `host`, from ONE resolution. Unless `allow_private`,
    refuses (BlockedAddress) if ANY of them is blocked: connecting to a checked subset would
    still let an attacker's name steer some attempts inward. Raises OSError if the name
    doesn't resolve (a transient failure)."""
    name = host.strip("[]").rstrip(".").lower()
    if not allow_private and (name in BLOCKED_HOSTNAMES or name.endswith(".localhost")):
        raise BlockedAddress(f"target host {name!r} is private", field="target.url")
    literal = parse_ip(name)
    addresses = [literal] if literal is not None else await resolver(name, port)
    if not addresses:
        raise OSError(f"{name!r} resolved to no address")
    if not allow_private:
        for addr in addresses:
            if is_blocked_ip(addr):
                raise BlockedAddress(f"target host {name!r} resolves to a private address "
                                     f"({addr})", field="target.url")
    return addresses
