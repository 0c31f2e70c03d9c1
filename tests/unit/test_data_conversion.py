"""Conversions in bounded memory: npz, parquet, jsonl and module data are converted a record
batch at a time into x.npy / y.npy, so no array of the whole file is ever in memory; the .npy
files are written front to back and read back exactly."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from disttrain_api.model import parse_spec
from disttrain_trainer.data import convert, load_dataset
from disttrain_trainer.data.convert import NpyAppender
from disttrain_trainer.process.config import ConfigError

ROWS, FEATURES = 60_000, 8  # 1.9 MB of float32 features, 480 KB of int64 labels


def spec(data: dict[str, Any]) -> Any:
    return parse_spec({"model": {"name": "mlp"}, "data": {"batchSize": 8, **data}})


def rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((ROWS, FEATURES)).astype(np.float32), rng.integers(0, 5, ROWS).astype(np.int64)


def write(fmt: str, folder: Path, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The file of `fmt` holding x and y, and the data spec that reads it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = [f"f{i}" for i in range(FEATURES)]
    if fmt == "npz":
        np.savez_compressed(folder / "d.npz", x=x, y=y)
        return {"path": str(folder / "d.npz"), "format": "npz"}
    table = pa.table({**{c: x[:, i] for i, c in enumerate(cols)}, "label": y})
    if fmt == "parquet":
        pq.write_table(table, folder / "d.parquet", row_group_size=5000)
        return {"path": str(folder / "d.parquet"), "format": "parquet", "featureColumns": cols}
    if fmt == "jsonl":
        with open(folder / "d.jsonl", "w") as f:
            for r in table.to_pylist():
                f.write(json.dumps(r) + "\n")
        return {"path": str(folder / "d.jsonl"), "format": "jsonl", "featureColumns": cols}
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    (folder / "rowsmod.py").write_text(
        "import numpy as np\n"
        "class Rows:\n"
        "    def __init__(self, folder):\n"
        "        self.x, self.y = np.load(folder + '/x.npy', mmap_mode='r'), np.load(folder + '/y.npy', mmap_mode='r')\n"
        "    def __len__(self):\n        return len(self.y)\n"
        "    def __getitem__(self, i):\n        return self.x[i], int(self.y[i])\n"
        "def make(path):\n    return Rows(path)\n"
    )
    return {"path": str(folder), "format": "module", "factory": "rowsmod:make"}


@pytest.mark.parametrize("fmt", ["npz", "parquet", "jsonl", "module"])
def test_a_conversion_holds_a_batch_not_the_file(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's allocations (traced) while converting stay far under the converted arrays' size."""
    monkeypatch.setattr(convert, "BATCH_ROWS", 250)
    for name in ("npz", "parquet", "module"):
        monkeypatch.setattr(f"disttrain_trainer.data.formats.{name}.BATCH_ROWS", 250, raising=False)
    monkeypatch.setattr("disttrain_trainer.data.formats.jsonl.BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr("disttrain_trainer.data.arrays.SCAN_CHUNK_BYTES", 64 << 10)  # the label scan's reads
    monkeypatch.syspath_prepend(str(tmp_path))
    x, y = rows()
    data = write(fmt, tmp_path, x, y)
    del x, y
    tracemalloc.start()
    try:
        ds = load_dataset(spec(data), tmp_path / "cache")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        sys.modules.pop("rowsmod", None)
    whole = ROWS * FEATURES * 4
    assert peak < whole / 3, f"{fmt}: peak {peak} bytes while converting {whole} bytes of features"
    x, y = rows()
    (converted,) = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(f"{fmt}-")]
    assert np.array_equal(np.load(converted / "x.npy"), x) and np.array_equal(np.load(converted / "y.npy"), y)
    assert ds.num_train == ROWS - ROWS // 10


def test_the_appended_npy_reads_back_with_its_row_count(tmp_path: Path) -> None:
    out = NpyAppender(tmp_path / "a.npy")
    parts = [np.arange(k * 6, dtype=np.uint8).reshape(k, 2, 3) for k in (1, 7, 300)]
    for p in parts:
        out.append(p)
    out.close()
    back = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert back.shape == (308, 2, 3) and np.array_equal(back, np.concatenate(parts))


def test_rows_whose_shape_changes_midway_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr("disttrain_trainer.data.formats.parquet.BATCH_ROWS", 2)
    vec = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0, 7.0], [8.0, 9.0, 1.0]], pa.list_(pa.float64()))
    pq.write_table(pa.table({"v": vec, "label": [0, 1, 0, 1]}), tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"rows of different shapes: \(2,\) and \(3,\) \(from row 2 on\)"):
        load_dataset(spec({"path": str(tmp_path / "d.parquet"), "format": "parquet", "featureColumns": ["v"]}),
                     tmp_path / "cache")  # fmt: skip


def test_jsonl_features_that_turn_from_integers_to_decimals_convert(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The reader types columns by the first block: features are read as floats whatever it shows."""
    monkeypatch.setattr("disttrain_trainer.data.formats.jsonl.BLOCK_BYTES", 1 << 10)
    lines = [{"a": i, "label": i % 2} for i in range(200)] + [{"a": 0.5, "label": 1}] * 20
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    load_dataset(spec({"path": str(tmp_path / "d.jsonl"), "format": "jsonl", "featureColumns": ["a"]}), tmp_path / "c")
    (x_file,) = (tmp_path / "c").glob("jsonl-*/x.npy")
    assert np.load(x_file)[-1, 0] == 0.5


def test_a_truncated_compressed_npz_is_refused(tmp_path: Path) -> None:
    x, y = rows()
    np.savez_compressed(tmp_path / "d.npz", x=x, y=y)
    data = (tmp_path / "d.npz").read_bytes()
    (tmp_path / "d.npz").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ConfigError, match="not a readable .npz archive"):
        load_dataset(spec({"path": str(tmp_path / "d.npz"), "format": "npz"}), tmp_path / "cache")
