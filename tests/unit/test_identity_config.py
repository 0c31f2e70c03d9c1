"""The trainer finds its credentials where the operator or the launcher put them, or says what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from disttrain_api import constants as C
from disttrain_api.identities import SERVER_KEY, credential
from disttrain_api.model import parse_spec
from disttrain_trainer.modes.federated import entry as fed_entry
from disttrain_trainer.modes.federated import settings as fed_settings
from disttrain_trainer.modes.paramserver import entry as ps_entry
from disttrain_trainer.modes.paramserver import settings as ps_settings
from disttrain_trainer.process.config import ConfigError, config_for
from disttrain_trainer.tensor_transport import auth


def cfg(mode: str, tmp_path: Path):  # noqa: ANN201
    return config_for(parse_spec({"mode": mode, "workers": {"replicas": 2}}), world_size=2, run_dir=tmp_path,
                      checkpoint_root=tmp_path)  # fmt: skip


@pytest.mark.parametrize(("mode", "load", "role"), [("federated", fed_settings.load, C.ROLE_CLIENT),
                                                    ("paramserver", ps_settings.load, C.ROLE_WORKER)])
def test_no_identity_folder_is_a_config_error_naming_the_variable(tmp_path: Path, mode: str, load, role: str) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match=C.ENV_IDENTITY_DIR):
        load(cfg(mode, tmp_path), {C.ENV_ROLE: role})


def test_a_missing_credential_names_the_clients_and_the_likely_cause(tmp_path: Path) -> None:
    key = auth.new_key()
    (tmp_path / "client-0").write_text(credential(key, "client-0").hex())
    s = fed_settings.load(cfg("federated", tmp_path), {C.ENV_ROLE: C.ROLE_CLIENT, C.ENV_IDENTITY_DIR: str(tmp_path)})
    assert fed_entry.client_credentials(s, ["client-0"]).identities == ["client-0"]
    with pytest.raises(ConfigError, match="client-0, client-9.*federated.clients or the gang size changed"):
        fed_entry.client_credentials(s, ["client-0", "client-9"])
    with pytest.raises(ConfigError, match="the aggregator's server key"):
        fed_entry.aggregator_key(s)
    (tmp_path / SERVER_KEY).write_text(key.hex())
    assert fed_entry.aggregator_key(s) == key


def test_a_worker_without_its_credential_says_so(tmp_path: Path) -> None:
    s = ps_settings.load(cfg("paramserver", tmp_path), {C.ENV_ROLE: C.ROLE_WORKER, C.ENV_IDENTITY_DIR: str(tmp_path)})
    with pytest.raises(ConfigError, match="the credential of worker-0"):
        ps_entry.worker_credentials(s)
    with pytest.raises(ConfigError, match="the parameter server's key"):
        ps_entry.read_server_key(s)
