"""API keys to tenants and scopes (constant-time, on hashes), and a token bucket per tenant.

Scopes are decided here, by HTTP method, and nowhere else: every route gets its tenant from
`Authenticator.tenant_of`, which refuses any method but GET and HEAD to a key without the
write scope. A new write route is refused to read keys without knowing scopes exist."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi import Request

from api.problems import Problem
from kron.clock import Clock
from kron.settings import KEY_HASH_PREFIX, ApiKey, Scope, hash_api_key
from streams.domain.tenants import TenantTable

# The methods that change nothing. Anything else (POST, PATCH, PUT, DELETE, ...) is a write.
READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Principal:
    """Who a request's key speaks for, and what it may do."""

    tenant: str
    scope: Scope


class Authenticator:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        # Only hashes are held (Settings has already hashed plaintext entries; hashing again
        # leaves a hash unchanged), so a memory dump or a debugger shows no usable key.
        self._keys = [(hash_api_key(k.key).encode(), Principal(tenant=k.tenant, scope=k.scope))
                      for k in keys]

    def tenant_of(self, request: Request) -> str:
        """The tenant of the request's key, once the key may do what the method asks."""
        who = self.principal(request)
        if request.method not in READ_METHODS and who.scope is not Scope.WRITE:
            raise Problem(403, "read-only-key",
                          f"this API key can only read: {request.method} needs a key with "
                          f"the write scope")
        return who.tenant

    def principal(self, request: Request) -> Principal:
        """The key's tenant and scope; 401 without a valid key. Does not check the scope."""
        presented = request.headers.get("x-api-key")
        auth = request.headers.get("authorization")
        if presented is None and auth is not None:
            scheme, _, token = auth.partition(" ")
            if scheme.lower() == "bearer":
                presented = token.strip()
        if not presented:
            raise Problem(401, "unauthorized", "an API key is required",
                          headers={"WWW-Authenticate": "Bearer"})
        # Always hash what was presented (not hash_api_key, which passes a hash through):
        # a leaked stored hash must not itself work as a key.
        given = (KEY_HASH_PREFIX + hashlib.sha256(presented.encode()).hexdigest()).encode()
        found = None
        for key, who in self._keys:
            # Compare against every key so the time taken says nothing about which matched.
            if hmac.compare_digest(given, key):
                found = who
        if found is None:
            raise Problem(401, "unauthorized", "the API key is not valid",
                          headers={"WWW-Authenticate": "Bearer"})
        return found


class RateLimiter:
    """A token bucket per tenant on its API writes, each tenant's its own size and rate
    (its TenantQuotas' create_burst and create_rate_per_s: KRON_TENANTS_FILE, else the
    KRON_TENANT_* defaults). A bucket starts full."""

    def __init__(self, *, clock: Clock, tenants: TenantTable) -> None:
        self._clock = clock
        self._tenants = tenants
        # tenant -> (tokens, last refill, rate per second, burst)
        self._buckets: dict[str, tuple[float, float, float, float]] = {}

    def take(self, tenant: str) -> None:
        now = self._clock.monotonic()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            quotas = self._tenants.quotas(tenant)
            rate, burst = quotas.create_rate_per_s, float(quotas.create_burst)
            tokens, last = burst, now
        else:
            tokens, last, rate, burst = bucket
        tokens = min(burst, tokens + (now - last) * rate)
        if tokens < 1.0:
            wait = (1.0 - tokens) / rate
            self._buckets[tenant] = (tokens, now, rate, burst)
            raise Problem(429, "rate-limited", "this tenant is over its request rate",
                          headers={"Retry-After": str(max(1, round(wait + 0.5)))})
        self._buckets[tenant] = (tokens - 1.0, now, rate, burst)
