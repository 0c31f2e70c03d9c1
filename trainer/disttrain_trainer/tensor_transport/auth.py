"""Identity credentials and the per-call tokens made from them.

Each identity (a federated client id, a parameter-server worker id) has its own
credential, HMAC-SHA256(server key, identity). Whoever starts the job (the operator,
`disttrain local`) mints the credentials once and gives every pod only those of
the identities it hosts; only the server holds the server key, and derives any
credential from it. So a pod can speak for its own identities and no other.

A call never carries the credential itself but a token bound to what the call
belongs to: HMAC-SHA256(credential, identity | session | binding), with the
session (the server process's random id, learnt from an unauthenticated-looking
bootstrap call) and the binding (a round attempt, a push's sequence number) sent
beside it. Changing any of them breaks the token; the server then decides
whether that session and binding are current for the method called, so a token
captured in one round, or from an earlier server process, is refused in another.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from disttrain_api.identities import credential

IDENTITY_KEY = "x-disttrain-identity"
SESSION_KEY = "x-disttrain-session"
BINDING_KEY = "x-disttrain-binding"
TOKEN_KEY = "authorization"
SCHEME = "Bearer "
REFUSAL_KEY = "x-disttrain-refusal"  # trailing metadata of a refused call: the reason label
KEY_BYTES = 32

# Rejection reasons (labels of the services' rejection counters).
NO_TOKEN = "no_token"  # identity or token metadata missing
UNKNOWN_IDENTITY = "unknown_identity"  # not one of the job's identities
BAD_TOKEN = "bad_token"  # made with no credential of this job, or altered
WRONG_IDENTITY = "wrong_identity"  # a valid credential of one identity used for another
EXPIRED_SESSION = "expired_session"  # bound to another server process (a replay, or a restart)
EXPIRED_ROUND = "expired_round"  # bound to another round / push than the current one
WRONG_BINDING = "wrong_binding"  # an authentic token made for another kind of call
EXPIRED = (EXPIRED_SESSION, EXPIRED_ROUND)
# Bounds of the search over every credential that diagnoses WRONG_IDENTITY: a flood of bad tokens
# must cost little (searches per second, and a burst of them, then plain BAD_TOKEN).
_SEARCH_MAX_IDENTITIES = 4096
_SEARCHES_PER_S = 10.0
_SEARCH_BURST = 10.0


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def _message(identity: str, session: str, binding: str) -> bytes:
    # Metadata values cannot hold a newline, so the fields cannot run into each other.
    return f"{identity}\n{session}\n{binding}".encode()


def token(cred: bytes, identity: str, session: str, binding: str) -> str:
    return hmac.new(cred, _message(identity, session, binding), hashlib.sha256).hexdigest()


def read_key(path: Path) -> bytes:
    """A key or credential file: 64 hex characters (what the operator and the launcher write)."""
    raw = path.read_text().strip()
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"{path} does not hold a hex key") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"{path} holds {len(key)} bytes, a key has {KEY_BYTES}")
    return key


@dataclass(frozen=True)
class Refusal:
    reason: str  # a counter label
    message: str

    def details(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class Claim:
    """Who a call says it comes from and what it says it belongs to (not yet verified)."""

    identity: str
    session: str
    binding: str
    token: str


def claim_of(metadata: Sequence[tuple[str, str | bytes]] | None) -> Claim | Refusal:
    md = {k: v for k, v in (metadata or ())}
    identity, tok = md.get(IDENTITY_KEY), md.get(TOKEN_KEY)
    if not isinstance(identity, str) or not identity:
        return Refusal(NO_TOKEN, f"no {IDENTITY_KEY} metadata")
    if not isinstance(tok, str) or not tok.startswith(SCHEME):
        return Refusal(NO_TOKEN, f"no bearer token for {identity}")
    session, binding = md.get(SESSION_KEY, ""), md.get(BINDING_KEY, "")
    return Claim(identity=identity, session=session if isinstance(session, str) else "",
                 binding=binding if isinstance(binding, str) else "", token=tok[len(SCHEME) :])  # fmt: skip


class Credentials:
    """A pod's side: the credentials of the identities it hosts, and the metadata of a call."""

    def __init__(self, by_identity: Mapping[str, bytes]):
        self._creds = dict(by_identity)

    @classmethod
    def derive(cls, server_key: bytes, identities: Iterable[str]) -> Credentials:
        """What the operator mints; in-process runs and tests hold the server key themselves."""
        return cls({i: credential(server_key, i) for i in identities})

    @classmethod
    def load(cls, folder: Path, identities: Iterable[str]) -> Credentials:
        """One file per identity, named by it. Raises FileNotFoundError naming the first missing one."""
        return cls({i: read_key(folder / i) for i in identities})

    @property
    def identities(self) -> list[str]:
        return sorted(self._creds)

    def metadata(self, identity: str, session: str, binding: str) -> tuple[tuple[str, str], ...]:
        cred = self._creds.get(identity)
        if cred is None:
            raise KeyError(f"this process holds no credential for {identity!r}")
        return ((IDENTITY_KEY, identity), (SESSION_KEY, session), (BINDING_KEY, binding),
                (TOKEN_KEY, SCHEME + token(cred, identity, session, binding)))  # fmt: skip


class Keyring:
    """The server's side: every identity of the job, each credential derived from the server key."""

    def __init__(self, server_key: bytes, identities: Iterable[str]):
        self._creds = {i: credential(server_key, i) for i in identities}
        self._lock = threading.Lock()
        self._searches = (_SEARCH_BURST, time.monotonic())  # token bucket: (allowance, at)

    def __contains__(self, identity: str) -> bool:
        return identity in self._creds

    def verify(self, claim: Claim) -> Refusal | None:
        """None when the token was made with the credential of the identity it claims, for the
        session and binding it claims (whether those are current is the caller's to decide)."""
        cred = self._creds.get(claim.identity)
        if cred is None:
            return Refusal(UNKNOWN_IDENTITY, f"{claim.identity!r} is not an identity of this job")
        if hmac.compare_digest(claim.token, token(cred, claim.identity, claim.session, claim.binding)):
            return None
        other = self._whose(claim)
        if other is not None:
            return Refusal(WRONG_IDENTITY, f"{claim.identity!r} presented {other}")
        return Refusal(BAD_TOKEN, f"wrong token for {claim.identity}")

    def _whose(self, claim: Claim) -> str | None:
        """Which other identity's credential made this token, if any (diagnosis only, rate-bounded):
        a token signed with another's credential for this identity, or another's token relabelled."""
        if len(self._creds) > _SEARCH_MAX_IDENTITIES:
            return None
        with self._lock:
            allowance, at = self._searches
            now = time.monotonic()
            allowance = min(_SEARCH_BURST, allowance + (now - at) * _SEARCHES_PER_S)
            if allowance < 1.0:
                self._searches = (allowance, now)
                return None
            self._searches = (allowance - 1.0, now)
        msg = _message(claim.identity, claim.session, claim.binding)
        for identity, cred in self._creds.items():
            if identity == claim.identity:
                continue
            if hmac.compare_digest(claim.token, hmac.new(cred, msg, hashlib.sha256).hexdigest()):
                return f"a token made with {identity}'s credential"
            if hmac.compare_digest(claim.token, token(cred, identity, claim.session, claim.binding)):
                return f"{identity}'s own token"
        return None
