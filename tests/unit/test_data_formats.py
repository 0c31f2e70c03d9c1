"""The formats people keep their data in: csv, a Hugging Face save_to_disk folder and a folder of
images by class give the rows they hold, refuse bad files naming them, and train with the loss
asked for (cross_entropy, mse on numeric labels, a loss of your own checked on one batch)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
from disttrain_trainer.models import build_model
from disttrain_trainer.process.config import ConfigError
from disttrain_trainer.run_common import evaluate, loss_fn_for


def spec(data: dict[str, Any], **training: Any) -> Any:
    return parse_spec({"model": {"name": "mlp", "hidden": 8, "layers": 1}, "data": {"batchSize": 8, **data},
                       "training": training})  # fmt: skip


def table(n: int = 50, float_label: bool = False) -> Any:
    import pyarrow as pa

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    label = (a + 2 * b) if float_label else (a > 0).astype(np.int64) + (b > 0)
    return pa.table({"a": a, "b": b, "label": label, "word": [f"w{i}" for i in range(n)]})


def write_csv(path: Path, t: Any) -> None:
    import pyarrow.csv as pc

    pc.write_csv(t, path)


def write_hf(path: Path, t: Any) -> None:
    import datasets

    datasets.Dataset(t).save_to_disk(str(path))


def refused(s: Any, cache: Path, *needles: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_dataset(s, cache)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("fmt", ["csv", "hfdataset"])
def test_columns_of_csv_and_a_saved_dataset_are_the_rows_they_hold(fmt: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    t = table()
    pq.write_table(t, tmp_path / "ref.parquet")
    path = tmp_path / ("d.csv" if fmt == "csv" else "d")
    (write_csv if fmt == "csv" else write_hf)(path, t)
    cols = {"featureColumns": ["a", "b"]}
    ref = load_dataset(spec({"path": str(tmp_path / "ref.parquet"), "format": "parquet", **cols}), tmp_path / "c")
    ds = load_dataset(spec({"path": str(path), "format": fmt, **cols}), tmp_path / "c")
    rows = np.arange(ref.num_train)
    assert (ds.num_train, ds.num_classes, ds.input_dim) == (ref.num_train, ref.num_classes, 2)
    assert np.allclose(ds.batch(rows)[0], ref.batch(rows)[0]) and np.array_equal(ds.batch(rows)[1], ref.batch(rows)[1])
    refused(spec({"path": str(path), "format": fmt, "featureColumns": ["a", "zz"]}), tmp_path / "c",
            "spec.data.featureColumns", "no column 'zz'", "a, b, label, word")
    refused(spec({"path": str(path), "format": fmt, "featureColumns": ["word"]}), tmp_path / "c",
            "column 'word'", "not numbers")


def test_decimal_labels_need_mse_and_then_train_as_a_regression(tmp_path: Path) -> None:
    write_csv(tmp_path / "d.csv", table(float_label=True))
    data = {"path": str(tmp_path / "d.csv"), "format": "csv", "featureColumns": ["a", "b"]}
    refused(spec(data), tmp_path / "c", "labels", "float64", "integer class indices", "training.loss: mse")
    s = spec(data, loss="mse")
    ds = load_dataset(s, tmp_path / "c")
    assert ds.targets == "values" and ds.num_classes == 1 and ds.batch(np.arange(4))[1].dtype == np.float32
    model = build_model(s, ds)  # one output per row: checked on a batch
    x, y = ds.batch(np.arange(8))
    loss = loss_fn_for(ds)(model(torch.from_numpy(x)), torch.from_numpy(y))
    assert loss.ndim == 0 and float(loss) > 0
    name, value = evaluate(model, ds, type("Amp", (), {"device": "cpu", "autocast": lambda self: torch.autocast("cpu", enabled=False)})())
    assert name == "val_loss" and value > 0


LOSSES = """
import torch
def huber(out, y):
    return torch.nn.functional.huber_loss(out.squeeze(-1), y.float())
def per_row(out, y):
    return (out.squeeze(-1) - y) ** 2
def broken(out, y):
    raise KeyError("no such label")
"""


def test_a_loss_of_your_own_is_checked_on_one_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mylosses.py").write_text(LOSSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    write_csv(tmp_path / "d.csv", table(float_label=True))
    data = {"path": str(tmp_path / "d.csv"), "format": "csv", "featureColumns": ["a", "b"]}
    try:
        s = spec(data, loss="mylosses:huber")
        ds = load_dataset(s, tmp_path / "c")
        assert ds.targets == "values" and ds.loss == "mylosses:huber"
        build_model(s, ds)
        for name, needle in [("mylosses:per_row", "returned a tensor of shape [2]"),
                             ("mylosses:broken", "KeyError"), ("mylosses:nothing", "cannot import")]:  # fmt: skip
            s = spec(data, loss=name)
            with pytest.raises(ConfigError, match=rf"training.loss '{name}'.*{needle.replace('[', '.').replace(']', '.')}"):
                build_model(s, load_dataset(s, tmp_path / "c"))
    finally:
        sys.modules.pop("mylosses", None)


def write_images(root: Path, per_class: int = 6) -> None:
    from PIL import Image

    for c, color in enumerate([(250, 10, 10), (10, 250, 10), (10, 10, 250)]):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            size = (20 + i, 16 + 2 * i)  # sizes differ: every image is resized
            Image.new("RGB" if i % 2 else "L", size, color if i % 2 else 128).save(folder / f"img{i}.png")


def test_an_image_folder_is_decoded_once_to_uint8_and_read_scaled(tmp_path: Path) -> None:
    write_images(tmp_path / "imgs")
    data = {"path": str(tmp_path / "imgs"), "format": "imagefolder", "imageSize": 8, "validationFraction": 0.2}
    ds = load_dataset(spec(data), tmp_path / "c")
    assert (ds.num_classes, ds.input_dim, ds.num_train + len(ds.test_y)) == (3, 3 * 8 * 8, 18)
    (entry,) = (tmp_path / "c").glob("imagefolder-*")
    assert np.load(entry / "x.npy", mmap_mode="r").dtype == np.uint8
    x, y = ds.batch(np.arange(ds.num_train))
    assert x.dtype == np.float32 and x.shape[1:] == (3, 8, 8) and 0.0 <= x.min() and x.max() <= 1.0
    red = x[y == 0]
    assert np.allclose(red[red[:, 1].max(axis=(1, 2)) < 0.1][:, 0], 250 / 255, atol=0.01)  # the RGB images of class 0
    cnn = parse_spec({"model": {"name": "cnn", "hidden": 4}, "data": {"batchSize": 4, **data}})
    assert build_model(cnn, load_dataset(cnn, tmp_path / "c"))(torch.from_numpy(x[:2])).shape == (2, 3)
    (tmp_path / "imgs" / "class1" / "zz-broken.png").write_bytes(b"not a png")
    refused(spec(data), tmp_path / "c", "zz-broken.png", "not an image Pillow can read")
    (tmp_path / "one" / "only").mkdir(parents=True)
    refused(spec({**data, "path": str(tmp_path / "one")}), tmp_path / "c", "1 class subfolders")


def test_a_dataset_dict_or_a_folder_that_is_no_dataset_is_refused(tmp_path: Path) -> None:
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset(table()), "test": datasets.Dataset(table(10))}).save_to_disk(
        str(tmp_path / "dd"))
    cols = {"format": "hfdataset", "featureColumns": ["a"]}
    refused(spec({"path": str(tmp_path / "dd"), **cols}), tmp_path / "c", "a DatasetDict", str(tmp_path / "dd" / "train"))
    (tmp_path / "empty").mkdir()
    refused(spec({"path": str(tmp_path / "empty"), **cols}), tmp_path / "c", "not a dataset saved with save_to_disk")
