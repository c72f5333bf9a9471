"""API keys to tenants (constant-time, on hashes), and a per-tenant token bucket."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from api.problems import Problem
from kron.clock import Clock
from kron.settings import KEY_HASH_PREFIX, hash_api_key


class Authenticator:
    def __init__(self, tenant_keys: dict[str, str]) -> None:
        # Only hashes are held (Settings has already hashed plaintext entries; hashing again
        # leaves a hash unchanged), so a memory dump or a debugger shows no usable key.
        self._keys = [(tenant, hash_api_key(key).encode())
                      for tenant, key in tenant_keys.items()]

    def tenant_of(self, request: Request) -> str:
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
        tenant = None
        for name, key in self._keys:
            # Compare against every key so the time taken says nothing about which matched.
            if hmac.compare_digest(given, key):
                tenant = name
        if tenant is None:
            raise Problem(401, "unauthorized", "the API key is not valid",
                          headers={"WWW-Authenticate": "Bearer"})
        return tenant


class RateLimiter:
    def __init__(self, *, clock: Clock, rate_per_s: float, burst: int) -> None:
        self._clock = clock
        self._rate = rate_per_s
        self._burst = float(burst)
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str) -> None:
        now = self._clock.monotonic()
        tokens, last = self._buckets.get(tenant, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens < 1.0:
            wait = (1.0 - tokens) / self._rate
            self._buckets[tenant] = (tokens, now)
            raise Problem(429, "rate-limited", "this tenant is over its request rate",
                          headers={"Retry-After": str(max(1, round(wait + 0.5)))})
        self._buckets[tenant] = (tokens - 1.0, now)
