"""schemathesis against the live API's own OpenAPI schema: no input may produce a 500.

schemathesis' pytest plugin does not run under pytest 9 yet, so the test drives its
per-operation Hypothesis strategies directly.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.integration


def test_no_input_makes_a_server_error(api_stack) -> None:
    schema = schemathesis.openapi.from_url(f"{api_stack.api.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures: list[str] = []
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def check(case) -> None:
            response = case.call(headers={"X-API-Key": "key-acme"}, timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} -> "
                                f"{response.status_code}: {response.text[:300]}")
            elif response.status_code >= 400:
                ctype = response.headers.get("content-type", "")
                ctype = ctype[0] if isinstance(ctype, list) else ctype
                assert ctype.startswith("application/problem+json"), (
                    case.method, case.path, response.text)

        check()
    assert not failures, failures
