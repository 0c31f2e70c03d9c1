"""Credentials, tokens and admission of the chunked-tensor transport, without a network."""

from __future__ import annotations

from pathlib import Path

import pytest
from disttrain_api import constants as C
from disttrain_api import model as api
from disttrain_api.identities import SERVER_KEY, client_ids
from disttrain_trainer.launcher.env import Slot
from disttrain_trainer.launcher.identity import provision
from disttrain_trainer.tensor_transport import auth
from disttrain_trainer.tensor_transport.limits import (
    BUSY,
    RATE_LIMITED,
    Admission,
    federated_limits,
)


def claim(md: tuple[tuple[str, str], ...]) -> auth.Claim:
    got = auth.claim_of(md)
    assert isinstance(got, auth.Claim)
    return got


def test_a_credential_speaks_for_its_own_identity_only() -> None:
    key = auth.new_key()
    ring = auth.Keyring(key, client_ids(3))
    mine = auth.Credentials.derive(key, ["client-0"])  # what pod 0 holds
    assert ring.verify(claim(mine.metadata("client-0", "s1", "3.4"))) is None
    # Its own token, the identity changed to another client's: refused, and whose credential made it is named.
    forged = tuple((k, "client-1" if k == auth.IDENTITY_KEY else v) for k, v in mine.metadata("client-0", "s1", "3.4"))
    bad = ring.verify(claim(forged))
    assert bad is not None and bad.reason == auth.WRONG_IDENTITY and "client-0's own token" in bad.message
    # A token for client-1 signed with client-0's credential (what a compromised pod 0 can make).
    cred0 = auth.credential(key, "client-0")
    minted = ((auth.IDENTITY_KEY, "client-1"), (auth.SESSION_KEY, "s1"), (auth.BINDING_KEY, "3.4"),
              (auth.TOKEN_KEY, auth.SCHEME + auth.token(cred0, "client-1", "s1", "3.4")))  # fmt: skip
    bad = ring.verify(claim(minted))
    assert bad is not None and bad.reason == auth.WRONG_IDENTITY and "client-0's credential" in bad.message
    # It cannot make a token for another identity at all: it holds no credential for it.
    with pytest.raises(KeyError, match="no credential for 'client-1'"):
        mine.metadata("client-1", "s1", "3.4")
    # A credential of another job (another server key), or of no identity of this job.
    other = auth.Credentials.derive(auth.new_key(), ["client-0"])
    assert ring.verify(claim(other.metadata("client-0", "s1", "3.4"))).reason == auth.BAD_TOKEN
    stranger = auth.Credentials.derive(key, ["client-9"])
    assert ring.verify(claim(stranger.metadata("client-9", "s1", "3.4"))).reason == auth.UNKNOWN_IDENTITY
    assert auth.claim_of(()).reason == auth.NO_TOKEN
    assert auth.claim_of(((auth.IDENTITY_KEY, "client-0"),)).reason == auth.NO_TOKEN


def test_a_token_binds_its_session_and_binding() -> None:
    key = auth.new_key()
    ring = auth.Keyring(key, ["worker-0"])
    md = dict(auth.Credentials.derive(key, ["worker-0"]).metadata("worker-0", "s1", "5"))
    for field, value in ((auth.SESSION_KEY, "s2"), (auth.BINDING_KEY, "6")):
        altered = tuple({**md, field: value}.items())
        assert ring.verify(claim(altered)).reason == auth.BAD_TOKEN, field


def test_credentials_load_only_the_files_of_their_identities(tmp_path: Path) -> None:
    key = auth.new_key()
    for cid in ("client-0", "client-1"):
        (tmp_path / cid).write_text(auth.credential(key, cid).hex())
    creds = auth.Credentials.load(tmp_path, ["client-1"])
    assert creds.identities == ["client-1"]
    with pytest.raises(FileNotFoundError):
        auth.Credentials.load(tmp_path, ["client-2"])
    (tmp_path / "short").write_text("abcd")
    with pytest.raises(ValueError, match="holds 2 bytes"):
        auth.read_key(tmp_path / "short")


def test_admission_limits_each_identitys_rate_and_calls_in_flight() -> None:
    now = [0.0]
    lim = federated_limits(clients=4, update_bytes=1000)
    adm = Admission(lim, clock=lambda: now[0])
    for _ in range(lim.max_calls_in_flight):
        assert adm.enter("client-0") is None
    assert adm.enter("client-0") == BUSY  # a fifth call at once
    assert adm.enter("client-1") is None  # another identity has its own allowance
    for _ in range(lim.max_calls_in_flight):
        adm.leave("client-0")
    for _ in range(lim.burst - lim.max_calls_in_flight):
        assert adm.enter("client-0") is None
        adm.leave("client-0")
    assert adm.enter("client-0") == RATE_LIMITED  # the burst is spent
    now[0] += 1.0 / lim.calls_per_s
    assert adm.enter("client-0") is None  # refilled at calls_per_s


def test_a_local_run_gives_each_process_only_its_own_credentials(tmp_path: Path) -> None:
    spec = api.parse_spec({"mode": "federated", "workers": {"replicas": 2},
                           "federated": {"clients": 5, "clientsPerRound": 2}})  # fmt: skip
    envs = [(Slot(rank=2, local_rank=0, node_rank=0), {C.ENV_ROLE: C.ROLE_AGGREGATOR}),
            *((Slot(rank=r, local_rank=0, node_rank=r), {C.ENV_ROLE: C.ROLE_CLIENT}) for r in range(2))]  # fmt: skip
    out = provision(tmp_path, spec, envs)
    dirs = [Path(env[C.ENV_IDENTITY_DIR]) for _, env in out]
    assert sorted(p.name for p in dirs[0].iterdir()) == [SERVER_KEY]
    assert sorted(p.name for p in dirs[1].iterdir()) == ["client-0", "client-2", "client-4"]
    assert sorted(p.name for p in dirs[2].iterdir()) == ["client-1", "client-3"]
    ring = auth.Keyring(auth.read_key(dirs[0] / SERVER_KEY), client_ids(5))
    creds = auth.Credentials.load(dirs[2], ["client-1", "client-3"])
    assert ring.verify(claim(creds.metadata("client-3", "s", "join"))) is None
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for d in dirs for p in d.iterdir())
    # Another attempt of the same run keeps the key: a restarted aggregator still knows every credential.
    again = provision(tmp_path, spec, envs)
    assert (Path(again[0][1][C.ENV_IDENTITY_DIR]) / SERVER_KEY).read_text() == (dirs[0] / SERVER_KEY).read_text()
