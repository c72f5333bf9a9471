"""KRON_API_KEYS scopes: `tenant:read=key` reads only, `tenant=key` (or `tenant:write=key`)
does everything; several keys per tenant; hashed keys with scopes; bad entries refused by
name, never echoing a key. The API refuses writes to read keys by method, in one place."""

from __future__ import annotations

import hashlib
from dataclasses import FrozenInstanceError

import pytest
from pydantic import ValidationError
from starlette.requests import Request

from api.auth import Authenticator, Principal
from api.problems import Problem
from kron.settings import ApiKey, Scope, Settings, format_api_keys, hash_api_key, parse_api_keys

K1, K2, R1 = "acme-write-one-7f3a", "acme-write-two-91bc", "acme-read-only-44d0"
R1_HASH = "sha256:" + hashlib.sha256(R1.encode()).hexdigest()


def key(tenant: str, scope: Scope, plain: str) -> ApiKey:
    return ApiKey(tenant=tenant, scope=scope, key=hash_api_key(plain))


def request(method: str, key: str | None = None) -> Request:
    headers = [(b"x-api-key", key.encode())] if key is not None else []
    return Request({"type": "http", "method": method, "path": "/v1/jobs", "headers": headers})


def test_an_entry_without_a_scope_is_a_write_key_and_scopes_are_read() -> None:
    assert parse_api_keys(f"acme={K1}, acme:read={R1}, globex:write=g") == (
        key("acme", Scope.WRITE, K1), key("acme", Scope.READ, R1), key("globex", Scope.WRITE, "g"))


def test_several_keys_per_tenant_all_stay() -> None:
    keys = parse_api_keys(f"acme={K1},acme={K2},acme:read={R1},acme:read=r2")
    assert [(k.tenant, k.scope) for k in keys] == [
        ("acme", Scope.WRITE), ("acme", Scope.WRITE), ("acme", Scope.READ), ("acme", Scope.READ)]
    assert len({k.key for k in keys}) == 4


def test_a_hashed_key_takes_a_scope_and_stays_as_given() -> None:
    assert parse_api_keys(f"acme:read={R1_HASH}") == (
        ApiKey(tenant="acme", scope=Scope.READ, key=R1_HASH),)


def test_settings_keep_only_hashes_with_their_scopes() -> None:
    s = Settings(api_keys=f"acme={K1},acme={K2},acme:read={R1}")
    for plain in (K1, K2, R1):
        assert plain not in s.api_keys
    assert s.api_keys == (f"acme={hash_api_key(K1)},acme={hash_api_key(K2)},"
                          f"acme:read={hash_api_key(R1)}")
    assert s.api_key_entries == parse_api_keys(f"acme={K1},acme={K2},acme:read={R1}")
    # The stored form reads back to itself: a child process given it gets the same keys.
    assert Settings(api_keys=s.api_keys).api_key_entries == s.api_key_entries
    assert format_api_keys(s.api_key_entries) == s.api_keys


@pytest.mark.parametrize("raw", [f"acme:admin={K1}", f"acme:READ={K1}", f"acme:read:x={K1}"])
def test_an_unknown_scope_names_the_entry_but_not_the_key(raw: str) -> None:
    with pytest.raises(ValueError, match="unknown scope") as info:
        parse_api_keys(f"globex=g,{raw}")
    assert "acme:" in str(info.value)
    assert K1 not in str(info.value)
    with pytest.raises(ValidationError) as at_start:
        Settings(api_keys=f"globex=g,{raw}")
    assert "unknown scope" in str(at_start.value) and "acme:" in str(at_start.value)
    assert K1 not in str(at_start.value)


@pytest.mark.parametrize("raw", ["acme:=k", ":read=k", "acme:read=", "acme:read"])
def test_malformed_scoped_entries_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_api_keys(raw)


@pytest.mark.parametrize("raw", [
    f"acme={K1},acme={K1}",              # the same entry twice
    f"acme={K1},acme:read={K1}",         # one key, two scopes
    f"acme={K1},globex={K1}",            # one key, two tenants
    f"acme={K1},globex={hash_api_key(K1)}",  # the same key, once plain and once hashed
])
def test_a_key_given_twice_is_refused_without_echoing_it(raw: str) -> None:
    with pytest.raises(ValueError, match="the same key") as info:
        parse_api_keys(raw)
    assert K1 not in str(info.value)
    with pytest.raises(ValidationError):
        Settings(api_keys=raw)


def test_entries_are_frozen_keyword_only_data() -> None:
    entry = key("acme", Scope.READ, R1)
    with pytest.raises(FrozenInstanceError):
        entry.scope = Scope.WRITE  # type: ignore[misc]
    with pytest.raises(TypeError):
        ApiKey("acme", Scope.READ, R1)  # type: ignore[misc]
    assert Scope("read") is Scope.READ and str(Scope.WRITE) == "write"


def auth() -> Authenticator:
    return Authenticator(Settings(api_keys=f"acme={K1},acme={K2},acme:read={R1_HASH},"
                                           f"globex:read=g-read").api_key_entries)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_read_key_reads(method: str) -> None:
    assert auth().tenant_of(request(method, R1)) == "acme"
    assert auth().tenant_of(request(method, "g-read")) == "globex"


@pytest.mark.parametrize("method", ["POST", "PATCH", "PUT", "DELETE", "OPTIONS", "TRACE"])
def test_a_read_key_is_refused_every_other_method(method: str) -> None:
    with pytest.raises(Problem) as info:
        auth().tenant_of(request(method, R1))
    assert info.value.status == 403
    assert info.value.kind == "read-only-key"
    # Still the tenant's key: only the scope is wanting.
    assert auth().principal(request(method, R1)) == Principal(tenant="acme", scope=Scope.READ)


@pytest.mark.parametrize("method", ["GET", "POST", "PATCH", "DELETE"])
def test_every_write_key_of_a_tenant_does_everything(method: str) -> None:
    assert auth().tenant_of(request(method, K1)) == "acme"
    assert auth().tenant_of(request(method, K2)) == "acme"


@pytest.mark.parametrize("presented", [None, "nope", R1_HASH])
def test_no_key_or_a_wrong_one_is_401_before_any_scope(presented: str | None) -> None:
    for method in ("GET", "POST"):
        with pytest.raises(Problem) as info:
            auth().tenant_of(request(method, presented))
        assert info.value.status == 401
