"""The send-time SSRF check uses the same address rules as the API's create-time check."""

from __future__ import annotations

import pytest

from streams.domain.errors import PermanentError
from streams.netguard import check_url


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
