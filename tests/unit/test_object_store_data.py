"""Data on a real S3-compatible server (moto in server mode on loopback, keys checked): token
windows read by ranged GETs give exactly the batches of the same local file, other formats are
staged once, and every bad store (missing bucket, refused keys, missing object, closed port, a key
that would be written outside the staging folder) is refused before training with the URI and what
is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset, object_store
from disttrain_trainer.data.formats.tokens_s3 import RemoteTokenFile
from disttrain_trainer.process.config import ConfigError
from ports import free_port  # tests/ports.py: each xdist worker's own slice

BLOCK = 8
GPT = {"name": "gpt", "hidden": 16, "layers": 1, "heads": 2, "blockSize": BLOCK}


@pytest.fixture
def aws_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


def spec(data: dict[str, Any], endpoint: str, model: dict[str, Any] | None = None) -> Any:
    return parse_spec({"model": model or GPT, "data": {"batchSize": 8, **data}, "objectStore": {"endpoint": endpoint}})


def write_tokens(folder: Path, n: int = 3000, vocab: int = 300) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, vocab, n).astype("uint16")
    tokens.tofile(folder / "train.bin")
    tokens[: n // 4].tofile(folder / "val.bin")


def upload(server: Any, bucket: str, folder: Path, prefix: str) -> None:
    client = server.client()
    for f in sorted(folder.iterdir()):
        client.upload_file(str(f), bucket, f"{prefix}/{f.name}")


def batches(ds: Any, rank: int, world: int, n: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    sampler = GlobalBatchSampler(ds.num_train, 8, seed=3, rank=rank, world=world)
    out = []
    for _ in range(n):
        rows = sampler.next_indices()
        ds.prefetch(sampler.peek_indices(2))
        out.append(ds.batch(rows))
    return out


@pytest.mark.parametrize("layout", ["prefix", "object"])
def test_tokens_from_s3_are_the_batches_of_the_same_local_file(aws_env: Any, tmp_path: Path, layout: str) -> None:
    write_tokens(tmp_path / "corpus")
    bucket = aws_env.bucket("tokens")
    upload(aws_env, bucket, tmp_path / "corpus", "corpus")
    local_path, uri = tmp_path / "corpus", f"s3://{bucket}/corpus"
    if layout == "object":
        local_path, uri = local_path / "train.bin", f"{uri}/train.bin"
    local = load_dataset(spec({"path": str(local_path), "format": "tokens"}, aws_env.url), tmp_path / "c1")
    remote = load_dataset(spec({"path": uri, "format": "tokens"}, aws_env.url), tmp_path / "c2")
    assert isinstance(remote.train_x, RemoteTokenFile) and remote.prefetches
    assert (remote.num_train, remote.num_classes) == (local.num_train, local.num_classes)
    np.testing.assert_array_equal(remote.test_x, local.test_x)
    for rank in range(2):  # each rank reads its own slice of every global batch
        for (rx, ry), (lx, ly) in zip(batches(remote, rank, 2), batches(local, rank, 2), strict=True):
            np.testing.assert_array_equal(rx, lx)
            np.testing.assert_array_equal(ry, ly)


def test_npy_arrays_under_a_prefix_are_staged_once_and_read_like_local_ones(aws_env: Any, tmp_path: Path) -> None:
    folder = tmp_path / "rows"
    folder.mkdir()
    rng = np.random.default_rng(1)
    np.save(folder / "x.npy", rng.standard_normal((60, 5)).astype(np.float32))
    np.save(folder / "y.npy", rng.integers(0, 3, 60).astype(np.int64))
    bucket = aws_env.bucket("rows")
    upload(aws_env, bucket, folder, "data/rows")
    mlp = {"name": "mlp"}
    local = load_dataset(spec({"path": str(folder), "format": "npy"}, aws_env.url, mlp), tmp_path / "c1")
    remote = load_dataset(spec({"path": f"s3://{bucket}/data/rows", "format": "npy"}, aws_env.url, mlp), tmp_path / "c2")
    rows = np.arange(10)
    for a, b in zip(remote.batch(rows), local.batch(rows), strict=True):
        np.testing.assert_array_equal(a, b)
    staged = [p for p in (tmp_path / "c2").iterdir() if p.name.startswith("s3-")]
    assert len(staged) == 1
    load_dataset(spec({"path": f"s3://{bucket}/data/rows", "format": "npy"}, aws_env.url, mlp), tmp_path / "c2")
    assert [p for p in (tmp_path / "c2").iterdir() if p.name.startswith("s3-")] == staged  # not staged again


def _refused(s: Any, cache: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_dataset(s, cache)
    return str(err.value)


def test_a_missing_bucket_a_missing_object_and_a_truncated_one_are_config_errors(aws_env: Any, tmp_path: Path) -> None:
    msg = _refused(spec({"path": "s3://no-such-bucket-x/corpus", "format": "tokens"}, aws_env.url), tmp_path)
    assert "spec.data.path" in msg and "'no-such-bucket-x'" in msg and "does not exist" in msg
    bucket = aws_env.bucket("miss")
    msg = _refused(spec({"path": f"s3://{bucket}/nothing", "format": "tokens"}, aws_env.url), tmp_path)
    assert f"s3://{bucket}/nothing" in msg and "train.bin" in msg
    aws_env.client().put_object(Bucket=bucket, Key="odd.bin", Body=b"\x01\x02\x03")  # 3 bytes: not uint16s
    msg = _refused(spec({"path": f"s3://{bucket}/odd.bin", "format": "tokens"}, aws_env.url), tmp_path)
    assert "truncated" in msg and "3 bytes" in msg
    msg = _refused(spec({"path": f"s3://{bucket}/rows", "format": "npy"}, aws_env.url, {"name": "mlp"}), tmp_path)
    assert f"s3://{bucket}/rows does not exist" in msg


@pytest.mark.parametrize(("key", "why"), [("rows/a/../../../escaped.npy", "has a '..' component"),
                                         ("rows//escaped.npy", "is absolute")])
def test_an_object_key_that_would_leave_the_staging_folder_is_refused_naming_it(
    aws_env: Any, tmp_path: Path, key: str, why: str
) -> None:
    bucket = aws_env.bucket("keys")
    for name in ("rows/x.npy", "rows/y.npy", key):
        aws_env.client().put_object(Bucket=bucket, Key=name, Body=b"\x93NUMPY")
    msg = _refused(spec({"path": f"s3://{bucket}/rows", "format": "npy"}, aws_env.url, {"name": "mlp"}), tmp_path)
    assert f"object key s3://{bucket}/{key} {why}" in msg and "refused" in msg, msg
    assert not list(tmp_path.rglob("escaped.npy"))


def test_refused_credentials_are_a_config_error(aws_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = aws_env.bucket("keys")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    # Another region: a client of its own (one is kept per endpoint and region in each process).
    s = parse_spec({"model": GPT, "data": {"path": f"s3://{bucket}/corpus", "format": "tokens"},
                    "objectStore": {"endpoint": aws_env.url, "region": "eu-west-3"}})  # fmt: skip
    msg = _refused(s, tmp_path)
    assert "refused access" in msg and f"s3://{bucket}/corpus" in msg and "credentialsSecret" in msg


def test_an_endpoint_that_does_not_answer_is_transient_not_a_config_error(aws_env: Any, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on
    with pytest.raises(object_store.StoreUnreachable) as err:
        load_dataset(spec({"path": "s3://corpus/train.bin", "format": "tokens"}, closed), tmp_path)
    assert not isinstance(err.value, ConfigError) and "not reachable" in str(err.value) and closed in str(err.value)


def test_peeking_ahead_names_the_next_batches_and_does_not_move_the_sampler() -> None:
    sampler = GlobalBatchSampler(50, 16, seed=1, rank=1, world=2)  # 3 batches an epoch: peeks cross epochs
    for _ in range(5):
        state = sampler.state_dict()
        ahead = sampler.peek_indices(4)
        assert sampler.state_dict() == state
        for expected in ahead:
            np.testing.assert_array_equal(sampler.next_indices(), expected)
        sampler.load_state_dict(state)
        sampler.next_indices()


def _hf_tiny() -> Any:
    import hf_tiny  # tests/hf_tiny.py: tests/conftest.py puts tests/ on sys.path

    return hf_tiny


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_text_column_on_s3_is_tokenized_like_the_same_local_file(aws_env: Any, tmp_path: Path, fmt: str) -> None:
    """textColumn on an s3:// file is staged and tokenized (it once went to the row converter, which
    asked for a label column)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    hf_tiny = _hf_tiny()
    hf_tiny.save_tokenizer(tmp_path / "tok")
    rows = [{"text": t} for t in hf_tiny.sentences(40)]
    (tmp_path / "src").mkdir()
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src" / "t.parquet")
    else:
        (tmp_path / "src" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bucket = aws_env.bucket("text")
    upload(aws_env, bucket, tmp_path / "src", "docs")
    data = {"format": fmt, "textColumn": "text", "tokenizer": str(tmp_path / "tok")}
    local = load_dataset(spec({"path": str(tmp_path / "src" / f"t.{fmt}"), **data}, aws_env.url), tmp_path / "c1")
    remote = load_dataset(spec({"path": f"s3://{bucket}/docs/t.{fmt}", **data}, aws_env.url), tmp_path / "c2")
    assert remote.kind == "lm" and (remote.num_train, remote.num_classes) == (local.num_train, local.num_classes)
    rows_ = np.arange(remote.num_train)
    np.testing.assert_array_equal(remote.batch(rows_)[0], local.batch(rows_)[0])


def test_an_hf_models_vocabulary_is_checked_against_s3_tokens(aws_env: Any, tmp_path: Path) -> None:
    """An hf: model on S3 token files takes the model's vocabulary and refuses ids past it, as a local
    file does (it once took the data's largest id + 1 and never compared)."""
    hf_tiny = _hf_tiny()
    small = hf_tiny.save_gpt2(tmp_path / "small", vocab=64)
    full = hf_tiny.save_gpt2(tmp_path / "full")
    hf_tiny.write_tokens(tmp_path / "corpus")  # ids up to 127
    bucket = aws_env.bucket("hftokens")
    upload(aws_env, bucket, tmp_path / "corpus", "corpus")
    data = {"data": {"path": f"s3://{bucket}/corpus", "format": "tokens", "batchSize": 4}}
    hf = lambda model: parse_spec({"model": {"name": f"hf:{model}", "blockSize": 16}, **data,  # noqa: E731
                                   "objectStore": {"endpoint": aws_env.url}})
    with pytest.raises(ConfigError, match=r"holds token id \d+, outside the vocabulary of model hf:.*small \(64\)"):
        ds = load_dataset(hf(small), tmp_path / "c")
        ds.batch(np.arange(ds.num_train))  # every window: the ids past 63 are refused as they are read
    assert load_dataset(hf(full), tmp_path / "c").num_classes == hf_tiny.VOCAB
