"""Your own data files, really written: read in place or converted once, and every bad file
refused before training with a ConfigError naming the path and the problem."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset
from disttrain_trainer.process.config import ConfigError

BLOCK = 8
GPT = {"name": "gpt", "hidden": 16, "layers": 1, "heads": 2, "blockSize": BLOCK}


def spec(data: dict[str, Any], model: dict[str, Any] | None = None) -> Any:
    return parse_spec({"model": model or {"name": "mlp"}, "data": {"batchSize": 8, **data}})


def write_tokens(folder: Path, n: int = 2000, vocab: int = 300, dtype: str = "uint16", val: bool = True) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, vocab, n).astype(dtype)
    tokens.tofile(folder / "train.bin")
    if val:
        tokens[: n // 4].tofile(folder / "val.bin")
    return tokens


def tokens_spec(folder: Path, **over: Any) -> Any:
    return spec({"path": str(folder), "format": "tokens", **over}, GPT)


def write_rows(folder: Path, n: int = 100, features: int = 6, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int64)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return x, y


def refused(s: Any, cache: Path, *needles: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_dataset(s, cache)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, msg
    return msg


# --------------------------------------------------------------- good files


def test_tokens_windows_are_read_from_the_file_in_place(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "corpus", vocab=300)
    ds = load_dataset(tokens_spec(tmp_path / "corpus"), tmp_path / "cache")
    assert ds.kind == "lm" and ds.num_train == len(tokens) - BLOCK - 1
    assert ds.num_classes == int(tokens.max()) + 1  # vocabSize 0: the largest id + 1
    x, y = ds.batch(np.array([0, 5, ds.num_train - 1]))
    assert np.array_equal(x[1], tokens[5 : 5 + BLOCK]) and np.array_equal(y[1], tokens[6 : 6 + BLOCK])
    assert np.array_equal(x[2], tokens[-BLOCK - 2 : -2])  # the last window (as pytext: len - block - 1 of them)
    vx, _ = ds.test_batches()
    assert vx.shape[1] == BLOCK and np.isin(vx, tokens[: len(tokens) // 4]).all()
    # Memory-mapped, not copied into the cache: the cache holds only the one-off scan.
    assert all(p.name.startswith(("scan-", ".scan-")) for p in (tmp_path / "cache").iterdir())  # and its lock


def test_a_token_file_without_val_holds_out_its_tail(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "c", n=1000, val=False, dtype="uint32")
    ds = load_dataset(tokens_spec(tmp_path / "c" / "train.bin", tokenDtype="uint32", vocabSize=512), tmp_path)
    assert ds.num_classes == 512 and ds.num_train == 900 - BLOCK - 1
    vx, vy = ds.test_batches()
    assert np.array_equal(vx[0], tokens[900 : 900 + BLOCK])


def test_npy_rows_are_split_and_read_through_the_sampler(tmp_path: Path) -> None:
    x, y = write_rows(tmp_path / "rows", n=100)
    ds = load_dataset(spec({"path": str(tmp_path / "rows"), "format": "npy"}), tmp_path / "cache")
    assert (ds.num_train, len(ds.test_y), ds.num_classes, ds.input_dim) == (90, 10, 3, 6)
    sampler = GlobalBatchSampler(ds.num_train, 8, 0)
    bx, by = ds.batch(sampler.next_indices())
    assert bx.dtype == np.float32 and by.dtype == np.int64
    for row, label in zip(bx, by, strict=True):  # every row is a row of the file with its own label
        (i,) = np.flatnonzero((x == row).all(axis=1))
        assert y[i] == label


def test_npz_parquet_jsonl_and_module_convert_once_to_the_same_rows(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = write_rows(tmp_path / "rows", n=40, features=2)
    np.savez(tmp_path / "d.npz", feats=x, labs=y)
    table = pa.table({"a": x[:, 0], "b": x[:, 1], "label": y})
    pq.write_table(table, tmp_path / "d.parquet")
    with open(tmp_path / "d.jsonl", "w") as f:
        for r in table.to_pylist():
            f.write(json.dumps(r) + "\n")
    (tmp_path / "mydata.py").write_text(
        "import numpy as np\n"
        "class Rows:\n"
        "    def __init__(self, folder):\n"
        "        self.x, self.y = np.load(folder + '/x.npy'), np.load(folder + '/y.npy')\n"
        "    def __len__(self):\n        return len(self.y)\n"
        "    def __getitem__(self, i):\n        return self.x[i], int(self.y[i])\n"
        "def make(path):\n    return Rows(path)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cols = {"featureColumns": ["a", "b"]}
    sources = [
        {"path": str(tmp_path / "d.npz"), "format": "npz", "features": "feats", "labels": "labs"},
        {"path": str(tmp_path / "d.parquet"), "format": "parquet", **cols},
        {"path": str(tmp_path / "d.jsonl"), "format": "jsonl", **cols},
        {"path": str(tmp_path / "rows"), "format": "module", "factory": "mydata:make"},
    ]
    reference = load_dataset(spec({"path": str(tmp_path / "rows"), "format": "npy"}), tmp_path / "cache")
    rows = np.arange(reference.num_train)
    for data in sources:
        ds = load_dataset(spec(data), tmp_path / "cache")
        assert ds.num_train == reference.num_train, data
        assert np.allclose(ds.batch(rows)[0], reference.batch(rows)[0]), data
        assert np.array_equal(ds.batch(rows)[1], reference.batch(rows)[1]), data
    sys.modules.pop("mydata", None)


def test_a_changed_file_is_converted_again(tmp_path: Path) -> None:
    x, y = write_rows(tmp_path / "rows", n=40)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    s = spec({"path": str(tmp_path / "d.npz"), "format": "npz"})
    first = load_dataset(s, tmp_path / "cache")
    np.savez(tmp_path / "d.npz", x=x * 0 + 7, y=y)
    st = (tmp_path / "d.npz").stat()
    os.utime(tmp_path / "d.npz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = load_dataset(s, tmp_path / "cache")
    assert not np.allclose(first.test_x, 7) and np.allclose(second.test_x, 7)


# ---------------------------------------------------------------- bad files


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    refused(tokens_spec(tmp_path / "nowhere"), tmp_path, "spec.data.path", str(tmp_path / "nowhere"), "does not exist")
    rel = spec({"path": "corpus", "format": "tokens", "mountPath": str(tmp_path)}, GPT)
    refused(rel, tmp_path, str(tmp_path / "corpus"), "relative paths resolve under spec.data.mountPath")


def test_a_truncated_token_file_is_refused(tmp_path: Path) -> None:
    write_tokens(tmp_path / "c", dtype="uint32")
    data = (tmp_path / "c" / "train.bin").read_bytes()
    (tmp_path / "c" / "train.bin").write_bytes(data[:-3])
    refused(tokens_spec(tmp_path / "c", tokenDtype="uint32"), tmp_path, str(tmp_path / "c" / "train.bin"),
            "not a whole number of uint32 token ids", "truncated")


def test_token_ids_past_the_vocabulary_are_refused(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "c", vocab=300)
    top = int(tokens.max())
    refused(tokens_spec(tmp_path / "c", vocabSize=100), tmp_path, "spec.data.vocabSize",
            f"holds token id {top}", f"at least {top + 1}")


def test_with_vocab_size_given_the_ids_are_not_scanned_but_checked_as_batches_read_them(tmp_path: Path) -> None:
    """vocabSize given: no scan of the file (nothing in the cache); a batch holding an id past it is
    refused when read, naming the file and the id, as the held-out windows are at load."""
    tokens = write_tokens(tmp_path / "c", vocab=50)
    tokens[1000] = 77  # in the training part only (val.bin is the first quarter)
    tokens.tofile(tmp_path / "c" / "train.bin")
    ds = load_dataset(tokens_spec(tmp_path / "c", vocabSize=60), tmp_path / "cache")
    assert ds.num_classes == 60 and not (tmp_path / "cache").exists()
    ds.batch(np.array([0, 10, 500]))
    with pytest.raises(ConfigError, match=r"spec.data.vocabSize: .*c holds token id 77, outside the vocabulary of 60"):
        ds.batch(np.array([0, 995]))
    tokens[5] = 99
    tokens[: len(tokens) // 4].tofile(tmp_path / "c" / "val.bin")
    refused(tokens_spec(tmp_path / "c", vocabSize=60), tmp_path, "validation windows", "token id 99")


def test_a_token_file_shorter_than_one_window_is_refused(tmp_path: Path) -> None:
    write_tokens(tmp_path / "c", n=BLOCK + 3, val=False)
    refused(tokens_spec(tmp_path / "c"), tmp_path, "fewer than one window of model.blockSize")


@pytest.mark.parametrize("cut", ["header", "data"])
def test_a_truncated_npy_is_refused(tmp_path: Path, cut: str) -> None:
    write_rows(tmp_path / "rows")
    f = tmp_path / "rows" / "x.npy"
    data = f.read_bytes()
    f.write_bytes(data[:40] if cut == "header" else data[:-100])
    refused(spec({"path": str(tmp_path / "rows"), "format": "npy"}), tmp_path, str(f), "not a readable .npy")


@pytest.mark.parametrize(
    ("x", "y", "needles"),
    [
        (np.zeros((10, 2), np.float32), np.zeros(10, np.float32), ("labels", "float32", "integer class indices")),
        (np.zeros(10, np.float32), np.zeros(10, np.int64), ("shape (10,)", "one row per sample")),
        (np.zeros((10, 2), np.float32), np.zeros(9, np.int64), ("10 feature rows but 9 labels",)),
        (np.zeros((10, 2), np.float32), np.full(10, -1, np.int64), ("span [-1, -1]", "outside [0,")),
    ],
    ids=["float-labels", "1d-features", "row-mismatch", "negative-label"],
)
def test_arrays_that_do_not_fit_a_classifier_are_refused(tmp_path: Path, x, y, needles) -> None:  # noqa: ANN001
    (tmp_path / "rows").mkdir()
    np.save(tmp_path / "rows" / "x.npy", x)
    np.save(tmp_path / "rows" / "y.npy", y)
    refused(spec({"path": str(tmp_path / "rows"), "format": "npy"}), tmp_path, *needles)


def test_labels_outside_the_given_classes_are_refused(tmp_path: Path) -> None:
    write_rows(tmp_path / "rows", classes=5)
    refused(spec({"path": str(tmp_path / "rows"), "format": "npy", "classes": 3}), tmp_path,
            "spec.data.classes", "outside [0, 3)")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_absent_or_non_numeric_column_is_refused(tmp_path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"a": [1.0, 2.0, 3.0], "word": ["x", "y", "z"], "label": [0, 1, 0]})
    f = tmp_path / f"d.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, f)
    else:
        f.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    refused(spec({"path": str(f), "format": fmt, "featureColumns": ["a", "b"]}), tmp_path / "c1",
            "spec.data.featureColumns", "no column 'b'", "a, word, label")
    refused(spec({"path": str(f), "format": fmt, "featureColumns": ["word"]}), tmp_path / "c2",
            "column 'word'", "not numbers")
    refused(spec({"path": str(f), "format": fmt, "featureColumns": ["a"], "labelColumn": "a"}), tmp_path / "c3",
            "labels", "float64", "integer class indices")


def test_a_truncated_npz_and_a_missing_key_are_refused(tmp_path: Path) -> None:
    x, y = write_rows(tmp_path / "rows")
    np.savez(tmp_path / "d.npz", x=x, y=y)
    refused(spec({"path": str(tmp_path / "d.npz"), "format": "npz", "labels": "labels"}), tmp_path / "c1",
            "spec.data.labels", "no array 'labels'", "x, y")
    data = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(data[: len(data) // 2])
    refused(spec({"path": str(tmp_path / "d.npz"), "format": "npz"}), tmp_path / "c2", "not a readable .npz")


def test_a_module_factory_that_cannot_be_imported_is_refused(tmp_path: Path) -> None:
    refused(spec({"format": "module", "factory": "no_such_pkg.data:make"}), tmp_path, "spec.data.factory",
            "cannot import", "installed in the image")


def test_features_that_do_not_fit_the_model_are_refused_before_training(tmp_path: Path) -> None:
    import torch
    from disttrain_trainer.models import build_model

    write_rows(tmp_path / "rows", features=6)  # not a square image
    s = spec({"path": str(tmp_path / "rows"), "format": "npy"}, {"name": "cnn", "hidden": 4})
    with pytest.raises(ConfigError, match="cnn needs square images.*6 features"):
        build_model(s, load_dataset(s, tmp_path / "cache"))
    images = tmp_path / "images"
    images.mkdir()
    np.save(images / "x.npy", np.zeros((20, 4, 4), np.float32))  # (samples, 4, 4): 16 features
    np.save(images / "y.npy", np.arange(20) % 2)
    s = spec({"path": str(images), "format": "npy"}, {"name": "cnn", "hidden": 4})
    ds = load_dataset(s, tmp_path / "cache")
    assert ds.input_dim == 16 and build_model(s, ds)(torch.from_numpy(ds.test_x)).shape[1] == 2
