"""API keys are hashed as soon as settings are read: no plaintext key in the settings
object, its repr/dumps, validation errors or JSON logs; auth compares hashes."""

from __future__ import annotations

import hashlib
import io
import logging

import pytest
from pydantic import ValidationError
from starlette.requests import Request
from typer.testing import CliRunner

from api.auth import Authenticator
from api.problems import Problem
from kron.cli import app
from kron.logs import JsonFormatter
from kron.settings import ApiKey, Scope, Settings, hash_api_key

PLAIN = "pl41n-acme-8c1f0e2d9b"
GLOBEX = "globex-only-known-as-a-hash"
GLOBEX_HASH = "sha256:" + hashlib.sha256(GLOBEX.encode()).hexdigest()


def settings() -> Settings:
    return Settings(api_keys=f"acme={PLAIN}, globex={GLOBEX_HASH}",
                    kafka_security_protocol="SASL_SSL", kafka_sasl_username="kron",
                    kafka_sasl_password="kafka-pw-9f8e7d")  # type: ignore[arg-type]


def request(**headers: str) -> Request:
    raw = [(k.lower().replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw})


def json_log(**extra: object) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test-security-keys")
    logger.addHandler(handler)
    try:
        logger.warning("settings %s", extra.get("settings"), extra=extra)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_plaintext_keys_are_hashed_at_startup() -> None:
    s = settings()
    assert {(k.tenant, k.key) for k in s.api_key_entries} == {
        ("acme", hash_api_key(PLAIN)), ("globex", GLOBEX_HASH)}
    assert hash_api_key(PLAIN) == "sha256:" + hashlib.sha256(PLAIN.encode()).hexdigest()


def test_env_keys_are_hashed_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRON_API_KEYS", f"acme={PLAIN}")
    s = Settings()
    assert PLAIN not in s.api_keys
    assert s.api_key_entries == (ApiKey(tenant="acme", scope=Scope.WRITE,
                                        key=hash_api_key(PLAIN)),)


def test_no_secret_in_repr_dump_or_json_logs() -> None:
    s = settings()
    dumps = [repr(s), str(s), str(s.model_dump()), s.model_dump_json(),
             json_log(settings=s, dump=s.model_dump(), json=s.model_dump_json())]
    for text in dumps:
        assert PLAIN not in text
        assert "kafka-pw-9f8e7d" not in text


@pytest.mark.parametrize("raw", [f"acme={PLAIN},broken", f"acme={PLAIN},b=sha256:zz"])
def test_validation_errors_do_not_echo_keys(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRON_API_KEYS", raw)
    with pytest.raises(ValidationError) as info:
        Settings()
    assert PLAIN not in str(info.value)


def test_malformed_hash_is_refused_not_taken_as_a_plaintext_key() -> None:
    with pytest.raises(ValidationError):
        Settings(api_keys="acme=sha256:abc")


def test_plaintext_and_hashed_entries_authenticate_and_wrong_keys_do_not() -> None:
    auth = Authenticator(settings().api_key_entries)
    assert auth.tenant_of(request(x_api_key=PLAIN)) == "acme"
    assert auth.tenant_of(request(authorization=f"Bearer {GLOBEX}")) == "globex"
    for wrong in ("nope", PLAIN + "x", GLOBEX_HASH, hash_api_key(PLAIN)):
        # A stored hash is not itself a key: leaking the config must not leak access.
        with pytest.raises(Problem) as info:
            auth.tenant_of(request(x_api_key=wrong))
        assert info.value.status == 401


def test_authenticator_holds_no_plaintext() -> None:
    # even if handed one directly
    auth = Authenticator([ApiKey(tenant="acme", scope=Scope.WRITE, key=PLAIN)])
    assert PLAIN.encode() not in repr(vars(auth)).encode()
    assert auth.tenant_of(request(x_api_key=PLAIN)) == "acme"


def test_cli_hash_prints_the_stored_form() -> None:
    result = CliRunner().invoke(app, ["keys", "hash", PLAIN])
    assert result.exit_code == 0, result.output
    # stdout only: CliRunner swaps the process's stderr while it runs, so a traceback that
    # another test's server thread prints meanwhile lands in `output` (seen in CI).
    printed = result.stdout.strip()
    assert printed == hash_api_key(PLAIN)
    from_stdin = CliRunner().invoke(app, ["keys", "hash", "-"], input=PLAIN + "\n")
    assert from_stdin.stdout.strip() == printed
    auth = Authenticator(Settings(api_keys=f"acme={printed}").api_key_entries)
    assert auth.tenant_of(request(x_api_key=PLAIN)) == "acme"
