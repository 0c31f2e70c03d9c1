"""Which Secrets a job's pods may mount and when new ones are due (job_secrets.py), without a cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from disttrain_api import model as api
from disttrain_operator import job_secrets
from disttrain_operator.observe import format_time
from disttrain_operator.settings import OperatorSettings, from_env
from disttrain_operator.topology.credentials import fresh_secret_name

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
DAY = 86400.0


def spec(mode: str = "federated", **over: Any) -> api.JobSpec:
    return api.parse_spec({"mode": mode, "workers": {"replicas": 2}, **over})


def recorded(tls_expires_in_s: float | None = 300 * DAY) -> dict[str, Any]:
    secrets: dict[str, Any] = {"identity": "j-identity-0123456789"}
    if tls_expires_in_s is not None:
        secrets |= {"tls": "j-tls-0123456789", "tlsNotAfter": format_time(NOW + timedelta(seconds=tls_expires_in_s))}
    return {"secrets": secrets}


def test_the_secrets_a_job_needs_follow_its_mode_and_tls_settings() -> None:
    assert job_secrets.needed(spec("data")) == ()
    assert job_secrets.needed(spec()) == ("identity", "tls")
    assert job_secrets.needed(spec(federated={"tls": False})) == ("identity",)
    assert job_secrets.needed(spec(federated={"tlsSecretName": "mine"})) == ("identity",)  # the user's: not renewed
    assert job_secrets.needed(spec("paramserver")) == ("identity", "tls")


def test_unrecorded_secrets_are_due_and_recorded_ones_are_not() -> None:
    assert job_secrets.due(spec(), {}, NOW, 30 * DAY) == ("identity", "tls")
    assert job_secrets.due(spec(), recorded(None), NOW, 30 * DAY) == ("tls",)
    assert job_secrets.due(spec(), recorded(), NOW, 30 * DAY) == ()
    assert job_secrets.due(spec("data"), {}, NOW, 30 * DAY) == ()


def test_the_certificate_is_due_once_only_the_renewal_margin_is_left() -> None:
    assert job_secrets.due(spec(), recorded(31 * DAY), NOW, 30 * DAY) == ()
    assert job_secrets.due(spec(), recorded(30 * DAY), NOW, 30 * DAY) == ("tls",)
    assert job_secrets.due(spec(), recorded(-1), NOW, 30 * DAY) == ("tls",)  # expired already
    assert job_secrets.seconds_until_due(spec(), recorded(31 * DAY), NOW, 30 * DAY) == DAY
    assert job_secrets.seconds_until_due(spec(), recorded(10), NOW, 30 * DAY) == 0.0
    assert job_secrets.seconds_until_due(spec(federated={"tls": False}), recorded(None), NOW, 30 * DAY) is None


def test_a_recorded_secret_keeps_the_others() -> None:
    status = recorded(None)
    job_secrets.record(status, "tls", "j-tls-abcdefabcd", NOW + timedelta(days=365))
    assert status["secrets"] == {"identity": "j-identity-0123456789", "tls": "j-tls-abcdefabcd",
                                 "tlsNotAfter": "2027-01-01T12:00:00Z"}  # fmt: skip
    assert job_secrets.recorded(status) == {"identity": "j-identity-0123456789", "tls": "j-tls-abcdefabcd"}


def test_fresh_names_are_unpredictable() -> None:
    names = {fresh_secret_name("j", "identity") for _ in range(100)}
    assert len(names) == 100 and all(n.startswith("j-identity-") and len(n) == len("j-identity-") + 10 for n in names)


def test_the_renewal_margin_must_be_shorter_than_the_validity() -> None:
    assert from_env({"DISTTRAIN_OPERATOR_TLS_VALIDITY": "120", "DISTTRAIN_OPERATOR_TLS_RENEW_BEFORE": "60"}).tls_valid_s == 120
    with pytest.raises(ValueError, match="DISTTRAIN_OPERATOR_TLS_RENEW_BEFORE .* shorter than"):
        from_env({"DISTTRAIN_OPERATOR_TLS_VALIDITY": "60", "DISTTRAIN_OPERATOR_TLS_RENEW_BEFORE": "60"})
    with pytest.raises(ValueError, match="must be positive"):
        OperatorSettings(tls_renew_before_s=0)
