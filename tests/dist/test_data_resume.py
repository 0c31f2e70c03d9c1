"""Exact resume and resume at another world size on every format, in separate processes: two
ranks (processes of their own, one data cache: one converts, the other waits) read their slices
of 6 global batches and save the sampler's state after 3; a third process at world size 1 loads
that state and reads the last 3. The two ranks' slices are, batch for batch, the batches one
uninterrupted process reads, and the resumed process continues them exactly. The model,
optimizer and checkpoint machinery around it is the same for every format (test_file_data.py
runs it on a token file and on a regression from CSV through the real trainer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BATCH, STEPS, SAVED_AT = 8, 6, 3
FORMATS = ["tokens", "npy", "npz", "parquet", "jsonl", "csv", "hfdataset", "imagefolder", "module", "text"]

READER = r"""
import json, sys
import numpy as np
from disttrain_api.model import parse_spec
from disttrain_trainer.data import GlobalBatchSampler, load_dataset

specs, cache, rank, world, steps, state_in, out = sys.argv[1:8]
rank, world, steps = int(rank), int(world), int(steps)
result = {}
for fmt, spec in json.loads(open(specs).read()).items():
    ds = load_dataset(parse_spec(spec), __import__("pathlib").Path(cache))
    s = GlobalBatchSampler(ds.num_train, spec["data"]["batchSize"], spec["data"].get("seed", 0), rank, world)
    if state_in != "-":
        s.load_state_dict(json.loads(open(state_in).read())[fmt])
    batches = []
    for step in range(steps):
        x, y = ds.batch(s.next_indices())
        batches.append([np.asarray(x, dtype=np.float64).round(6).tolist(), np.asarray(y).tolist()])
        if step + 1 == %(saved_at)d and state_in == "-":
            result.setdefault("state", {})[fmt] = s.state_dict()
    result[fmt] = batches
open(out, "w").write(json.dumps(result))
""" % {"saved_at": SAVED_AT}


def write_sources(root: Path) -> dict[str, dict[str, Any]]:
    """One small file of each format, and the job spec that reads it."""
    import datasets
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(5)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    y = rng.integers(0, 3, 60).astype(np.int64)
    (root / "rows").mkdir()
    np.save(root / "rows" / "x.npy", x)
    np.save(root / "rows" / "y.npy", y)
    np.savez(root / "d.npz", x=x, y=y)
    table = pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": y,
                      "text": [f"row {i} says {'ab' * (i % 5)} done" for i in range(60)]})  # fmt: skip
    pq.write_table(table, root / "d.parquet")
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    pcsv.write_csv(table, root / "d.csv")
    datasets.Dataset(table).save_to_disk(str(root / "hf"))
    for c in range(3):
        (root / "img" / f"c{c}").mkdir(parents=True)
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(root / "img" / f"c{c}" / f"{i}.png")
    rng.integers(0, 200, 3000).astype(np.uint16).tofile(root / "train.bin")
    (root / "rowsmod.py").write_text(
        "import numpy as np\n"
        "class Rows:\n"
        "    def __init__(self, folder):\n"
        "        self.x, self.y = np.load(folder + '/x.npy'), np.load(folder + '/y.npy')\n"
        "    def __len__(self):\n        return len(self.y)\n"
        "    def __getitem__(self, i):\n        return self.x[i], int(self.y[i])\n"
        "def make(path):\n    return Rows(path)\n"
    )
    import hf_tiny

    hf_tiny.save_tokenizer(root / "tok")
    cols = {"featureColumns": ["a", "b", "c"]}
    data = {
        "tokens": {"path": str(root / "train.bin"), "format": "tokens", "vocabSize": 256},
        "npy": {"path": str(root / "rows"), "format": "npy"},
        "npz": {"path": str(root / "d.npz"), "format": "npz"},
        "parquet": {"path": str(root / "d.parquet"), "format": "parquet", **cols},
        "jsonl": {"path": str(root / "d.jsonl"), "format": "jsonl", **cols},
        "csv": {"path": str(root / "d.csv"), "format": "csv", **cols},
        "hfdataset": {"path": str(root / "hf"), "format": "hfdataset", **cols},
        "imagefolder": {"path": str(root / "img"), "format": "imagefolder", "imageSize": 4},
        "module": {"path": str(root / "rows"), "format": "module", "factory": "rowsmod:make"},
        "text": {"path": str(root / "d.parquet"), "format": "parquet", "textColumn": "text",
                 "tokenizer": str(root / "tok")},  # fmt: skip
    }
    lm = {"name": "gpt", "hidden": 8, "layers": 1, "heads": 2, "blockSize": 8}
    return {fmt: {"model": lm if fmt in ("tokens", "text") else {"name": "mlp"},
                  "data": {**d, "batchSize": BATCH, "seed": 3}} for fmt, d in data.items()}  # fmt: skip


def read(tmp: Path, specs: Path, rank: int, world: int, steps: int, state: str, name: str) -> subprocess.Popen[str]:
    env_path = f"{tmp}:{Path(__file__).parents[1]}"
    return subprocess.Popen([sys.executable, "-c", READER, str(specs), str(tmp / "cache"), str(rank), str(world),
                             str(steps), state, str(tmp / name)], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**__import__("os").environ, "PYTHONPATH": env_path})  # fmt: skip


def finish(*procs: subprocess.Popen[str]) -> str:
    """Wait for the processes; their stderr, joined."""
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-3000:] for _, e in outs]
    return "".join(e for _, e in outs)


def test_every_format_resumes_exactly_at_another_world_size(tmp_path: Path) -> None:
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(write_sources(tmp_path)))
    log = finish(*(read(tmp_path, specs, r, 2, STEPS, "-", f"rank{r}.json") for r in range(2)))
    built = [line.split("building ")[1].split()[0] for line in log.splitlines() if "data cache: building " in line]
    assert len(built) == len(set(built)) and any(b.startswith("csv-") for b in built), log  # each entry once
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    states = tmp_path / "state.json"
    states.write_text(json.dumps(r0["state"]))
    finish(read(tmp_path, specs, 0, 1, STEPS, "-", "single.json"),
           read(tmp_path, specs, 0, 1, STEPS - SAVED_AT, str(states), "resumed.json"))  # fmt: skip
    single = json.loads((tmp_path / "single.json").read_text())
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    for fmt in FORMATS:
        joined = [[a[0] + b[0], a[1] + b[1]] for a, b in zip(r0[fmt], r1[fmt], strict=True)]
        assert joined == single[fmt], f"{fmt}: two ranks' slices are not the one process's batches"
        assert resumed[fmt] == single[fmt][SAVED_AT:], f"{fmt}: the resumed batches differ"
        assert len({json.dumps(b) for b in single[fmt]}) == STEPS, f"{fmt}: batches repeat"
