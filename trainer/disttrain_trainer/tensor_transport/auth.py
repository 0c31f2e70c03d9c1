"""Per-client tokens: HMAC-SHA256(key, client id), sent as call metadata and checked on every call.

One Secret key serves any number of clients without a token list to keep in
sync; a token proves the holder may speak for exactly one client id.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

CLIENT_KEY = "x-disttrain-client"
TOKEN_KEY = "authorization"
SCHEME = "Bearer "


def new_key() -> bytes:
    return secrets.token_bytes(32)


def token_for(key: bytes, client_id: str) -> str:
    return hmac.new(key, client_id.encode(), hashlib.sha256).hexdigest()


def metadata_for(key: bytes, client_id: str) -> tuple[tuple[str, str], ...]:
    return ((CLIENT_KEY, client_id), (TOKEN_KEY, SCHEME + token_for(key, client_id)))


def check(key: bytes, metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[str | None, str]:
    """(client id, "") when the call carries a valid token; (None, reason) otherwise."""
    md = {k: v for k, v in (metadata or ())}
    client = md.get(CLIENT_KEY)
    token = md.get(TOKEN_KEY)
    if not isinstance(client, str) or not client:
        return None, f"no {CLIENT_KEY} metadata"
    if not isinstance(token, str) or not token.startswith(SCHEME):
        return None, f"no bearer token for client {client}"
    if not hmac.compare_digest(token[len(SCHEME) :], token_for(key, client)):
        return None, f"wrong token for client {client}"
    return client, ""
