"""Config parsing: the env contract and the spec JSON into a frozen TrainerConfig, with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from disttrain_api import constants as C
from disttrain_api.model import parse_spec, to_json
from disttrain_trainer.process.config import ConfigError, load_config


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    path = tmp / "config.json"
    path.write_text(
        json.dumps(to_json(parse_spec({"workers": {"replicas": 2, "procsPerWorker": 2}})))
    )
    return {
        C.ENV_CONFIG: str(path),
        C.ENV_WORLD_SIZE: "4",
        C.ENV_JOB: "j1",
        C.ENV_MASTER_ADDR: "m",
        **extra,
    }


def test_env_contract_with_rank(tmp_path: Path) -> None:
    cfg = load_config(env_for(tmp_path, RANK="3", LOCAL_RANK="1", NODE_RANK="1", DISTTRAIN_CHECKPOINT_DIR="/ck",
                              DISTTRAIN_METRICS_PORT="9500", MASTER_PORT="1234"))  # fmt: skip
    assert (cfg.rank, cfg.local_rank, cfg.world_size, cfg.master_port) == (3, 1, 4, 1234)
    assert cfg.checkpoint_dir == Path("/ck/j1")
    assert cfg.metrics_port == 9501
    assert cfg.spec.workers.replicas == 2


def test_without_rank_the_pod_spawns_local_ranks(tmp_path: Path) -> None:
    cfg = load_config(env_for(tmp_path, NODE_RANK="1", NPROC_PER_NODE="2"))
    assert cfg.rank is None
    child = cfg.for_local_rank(1)
    assert (child.rank, child.local_rank, child.metrics_port) == (3, 1, 9401)
    assert cfg.checkpoint_dir == Path("/checkpoints/j1")  # spec.checkpoint.path default


def test_metrics_port_zero_is_off(tmp_path: Path) -> None:
    assert load_config(env_for(tmp_path, RANK="0", DISTTRAIN_METRICS_PORT="0")).metrics_port == 0


@pytest.mark.parametrize(
    "extra,message",
    [
        ({C.ENV_RANK: "4"}, "RANK=4 must be in [0, WORLD_SIZE=4)"),
        ({C.ENV_RANK: "x"}, "RANK='x' must be an integer"),
        ({C.ENV_DEVICE: "tpu"}, "DISTTRAIN_DEVICE='tpu' must be cpu or cuda"),
    ],
)
def test_bad_env_names_the_variable(tmp_path: Path, extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env_for(tmp_path, **extra))
    assert message in str(e.value)


def test_missing_or_bad_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="DISTTRAIN_CONFIG is not set"):
        load_config({})
    with pytest.raises(ConfigError, match="file not found"):
        load_config({C.ENV_CONFIG: str(tmp_path / "nope.json")})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"training": {"steps": 0}}))
    with pytest.raises(ConfigError, match=r"spec.training.steps: 0 must be >= 1"):
        load_config({C.ENV_CONFIG: str(bad)})


def test_unresolvable_master_times_out_with_a_transient_error() -> None:
    from disttrain_trainer.process.dist_env import RendezvousError, wait_for_master

    # Not a ConfigError: rank 0's pod may just be Pending, a retry can succeed.
    with pytest.raises(RendezvousError, match="MASTER_ADDR='no-such-host.invalid' did not resolve"):
        wait_for_master("no-such-host.invalid", timeout_s=0.5)


def test_rendezvous_timeout_comes_from_the_env(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(to_json(parse_spec({}))))
    assert load_config({C.ENV_CONFIG: str(path)}).rendezvous_timeout_s == 300.0
    cfg = load_config({C.ENV_CONFIG: str(path), C.ENV_RENDEZVOUS_TIMEOUT: "2.5"})
    assert cfg.rendezvous_timeout_s == 2.5
    with pytest.raises(ConfigError, match="DISTTRAIN_RENDEZVOUS_TIMEOUT_S='soon' must be a positive"):
        load_config({C.ENV_CONFIG: str(path), C.ENV_RENDEZVOUS_TIMEOUT: "soon"})


def test_cross_field_rules_apply(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(to_json(parse_spec({"model": {"name": "gpt"}, "data": {"name": "digits"}})))
    )
    with pytest.raises(ConfigError, match="spec.data.name"):
        load_config({C.ENV_CONFIG: str(path), C.ENV_RANK: "0"})


@pytest.mark.parametrize(("mode", "role", "node_rank", "writes"), [
    ("data", "", 1, True), ("federated", C.ROLE_AGGREGATOR, 0, True), ("federated", C.ROLE_CLIENT, 0, False),
    ("paramserver", C.ROLE_SERVER, 1, True), ("paramserver", C.ROLE_WORKER, 0, True),
    ("paramserver", C.ROLE_WORKER, 1, False), ("data", C.ROLE_LIGHTHOUSE, 0, False),
])  # fmt: skip
def test_only_the_pods_that_write_checkpoints_attach_the_bucket(tmp_path: Path, mode: str, role: str, node_rank: int,
                                                                writes: bool) -> None:  # fmt: skip
    """The same answer as the operator's mounts and credentials (disttrain_api.checkpoint_access): a
    federated client or parameter-server worker 1 never touches checkpoint.uri (it has no credentials)."""
    path = tmp_path / "config.json"
    body = {"mode": mode, "workers": {"replicas": 2}, "model": {"name": "mlp"}, "data": {"name": "digits"}}
    path.write_text(json.dumps(to_json(parse_spec(body))))
    cfg = load_config({C.ENV_CONFIG: str(path), C.ENV_WORLD_SIZE: "2", C.ENV_RANK: str(node_rank),
                       C.ENV_NODE_RANK: str(node_rank), C.ENV_ROLE: role})  # fmt: skip
    assert cfg.writes_checkpoints is writes
