"""Validation of the channel-security fields of the federated and parameter-server modes."""

from __future__ import annotations

from typing import Any

from disttrain_api.validation import check_job


def job(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "disttrain.dev/v1alpha1", "kind": "DistTrainJob", "metadata": {"name": "j"}, "spec": spec}


def test_a_shared_token_key_is_refused_with_the_reason() -> None:
    _, errors = check_job(job({"mode": "federated", "federated": {"tokenSecretName": "shared"}}))
    (error,) = [str(e) for e in errors]
    assert error.startswith("spec.federated.tokenSecretName: is not supported")
    assert "lets any of them speak for any client" in error and "remove it" in error


def test_paramserver_tls_fields_are_accepted() -> None:
    parsed, errors = check_job(job({"mode": "paramserver", "paramServer": {"tls": False, "tlsSecretName": "mine"}}))
    assert errors == []
    assert parsed.spec.param_server.tls is False and parsed.spec.param_server.tls_secret_name == "mine"
    _, errors = check_job(job({"mode": "paramserver", "paramServer": {"tlsSecretName": "Not_A_Name"}}))
    assert [e.path for e in errors] == ["spec.paramServer.tlsSecretName"]
