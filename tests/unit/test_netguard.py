"""The send-time SSRF check uses the same address rules as the API's create-time check."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import pytest

from api.models import InvalidField, build_spec, parse_request
from streams.domain.errors import PermanentError
from streams.netguard import BlockedAddress, IPAddress, check_url, resolve_pinned


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://2130706433/", "http://0x7f.1/", "http://[::1]/",
    "http://169.254.169.254/latest", "http://100.64.0.1/", "http://[::ffff:10.0.0.1]/",
    "http://[64:ff9b::7f00:1]/", "http://[2002:7f00:1::]/", "http://localhost/",
])
def test_private_addresses_are_refused_at_send_time(url: str) -> None:
    with pytest.raises(PermanentError):
        check_url(url, allow_private=False, resolve=False)
    check_url(url, allow_private=True, resolve=False)


def test_public_address_passes() -> None:
    check_url("https://93.184.215.14/hook", allow_private=False, resolve=False)


# --- every encoding, at create time (API) and at send time (resolve_pinned) -------------------

# Host forms a resolver or a URL parser turns into a blocked address.
HOSTILE_HOSTS = [
    "2130706433",             # decimal 127.0.0.1
    "0177.0.0.1",             # octal
    "0x7f.0.0.1",             # hex
    "0x7f000001",             # one hex number
    "127.1",                  # short form
    "127.0.0.1.",             # trailing dot
    "[::ffff:127.0.0.1]",     # IPv4-mapped IPv6
    "[::ffff:7f00:1]",        # the same, in hex groups
    "[::1]",                  # bracketed IPv6 loopback
    "[0:0:0:0:0:0:0:1]",
    "169.254.169.254",        # cloud metadata
    "[fd00:ec2::254]",        # AWS metadata over IPv6
    "[fe80::1]",              # link-local
    "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1", "0.0.0.0",
    "localhost", "LocalHost", "localhost.", "api.localhost", "METADATA.google.internal",
]


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_hostile_hosts_are_refused_at_send_time(host: str) -> None:
    with pytest.raises(PermanentError):
        check_url(f"http://{host}:8080/x", allow_private=False, resolve=False)


@pytest.mark.parametrize("host", HOSTILE_HOSTS)
def test_hostile_hosts_are_refused_at_create_time(host: str) -> None:
    raw = {"name": "n", "schedule": {"cron": "* * * * *"},
           "target": {"type": "http", "url": f"http://{host}:8080/x"}}
    with pytest.raises(InvalidField) as info:
        build_spec(parse_request(raw), now_ms=1_780_000_000_000, allow_private=False)
    assert info.value.field == "target.url"


def _resolver(table: dict[str, list[str]]) -> Any:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in table[host]]
    return resolve


def _pinned(host: str, table: dict[str, list[str]], *, allow_private: bool = False
            ) -> list[IPAddress]:
    return asyncio.run(resolve_pinned(host, 443, allow_private=allow_private,
                                      resolver=_resolver(table)))


@pytest.mark.parametrize("host", [h.strip("[]") for h in HOSTILE_HOSTS])
def test_resolve_pinned_refuses_literals_and_local_names_without_dns(host: str) -> None:
    with pytest.raises(BlockedAddress):
        _pinned(host, {})  # an empty DNS table: any lookup would be a KeyError


# DNS is stubbed in these tests: real DNS can't be pointed at chosen addresses here.
@pytest.mark.parametrize("answer", [
    ["127.0.0.1"], ["::1"], ["::ffff:127.0.0.1"], ["169.254.169.254"], ["fd00:ec2::254"],
    ["93.184.215.14", "10.0.0.7"],  # one bad address among good ones is enough to refuse
])
def test_a_name_resolving_to_a_private_address_is_refused(answer: list[str]) -> None:
    with pytest.raises(BlockedAddress):
        _pinned("Hooks.Example.COM.", {"hooks.example.com": answer})


def test_public_answers_are_returned_in_order_and_private_allowed_when_configured() -> None:
    table = {"hooks.example.com": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]}
    assert [str(a) for a in _pinned("hooks.example.com", table)] == table["hooks.example.com"]
    assert [str(a) for a in _pinned("db.internal", {"db.internal": ["10.1.2.3"]},
                                    allow_private=True)] == ["10.1.2.3"]


def test_literal_public_ip_needs_no_dns() -> None:
    assert _pinned("[2606:4700::1111]", {}) == [ipaddress.ip_address("2606:4700::1111")]
