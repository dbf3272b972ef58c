"""Where rackbench may send requests on a user's behalf (verdict webhooks): not to itself, its database or the
private networks around it, unless the deployment allows it."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def internal(address: str) -> bool:
    """Loopback, private, link-local (cloud metadata), multicast, reserved or unspecified."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return bool(
        ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified
    )


def url_refusal(url: str, *, resolve: bool = True) -> str:
    """Why a request to ``url`` is refused ('' when it is not): a host that is, or resolves to, an internal
    address. ``resolve=False`` checks only a literal address or ``localhost`` (no DNS, for validating a definition);
    the sender resolves, and checks every address the name has."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "not a valid URL"
    if not host:
        return "the URL has no host"
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return f"{host} is this machine"
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        if not resolve:
            return ""
        try:
            addresses = sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
        except (OSError, UnicodeError) as exc:
            return f"{host} cannot be resolved ({exc})"
    bad = [a for a in addresses if internal(a)]
    if bad:
        return f"{host} is an internal address ({', '.join(bad[:3])}): loopback, private and link-local are refused"
    return ""
