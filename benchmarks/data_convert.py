"""Conversion in bounded memory: a 2 GB parquet file (8 million rows of 32 float64 feature columns
with 3 decimals and an integer label, uncompressed) and the same rows as CSV (1.1 GB), each converted by load_dataset into the data
cache's x.npy / y.npy in a process of its own. Reported: the converting process's peak resident
memory (VmHWM, sampled every 50 ms from /proc), the wall time, the file's size and the rows.
The files are written a chunk at a time (bounded memory here too).

    .venv/bin/python benchmarks/data_convert.py [--rows 8000000] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from proc_stats import peak_rss_mb

FEATURES = 32
CHUNK = 250_000
CONVERT = r"""
import sys, json
from disttrain_api.model import parse_spec
from disttrain_trainer.data import load_dataset
ds = load_dataset(parse_spec(json.loads(sys.argv[1])), __import__("pathlib").Path(sys.argv[2]))
print(json.dumps({"train_rows": ds.num_train, "features": ds.input_dim}))
"""


def write_files(work: Path, rows: int) -> tuple[Path, Path]:
    import pyarrow as pa  # noqa: PLC0415 - the trainer extra
    import pyarrow.csv as pcsv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    names = [f"f{i}" for i in range(FEATURES)]
    schema = pa.schema([*(pa.field(n, pa.float64()) for n in names), pa.field("label", pa.int64())])
    rng = np.random.default_rng(0)
    pq_path, csv_path = work / "data.parquet", work / "data.csv"
    # Plain encoding, no compression: the parquet file is as large as its values (2.1 GB for 8M rows),
    # as a file of measurements that compress poorly would be.
    with pq.ParquetWriter(pq_path, schema, compression="none", use_dictionary=False) as pw, \
            pcsv.CSVWriter(csv_path, schema) as cw:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            x = np.round(rng.standard_normal((n, FEATURES)), 3)
            t = pa.table({**{c: x[:, i] for i, c in enumerate(names)}, "label": (x[:, 0] > 0).astype(np.int64)},
                         schema=schema)  # fmt: skip
            pw.write_table(t)
            cw.write_table(t)
    return pq_path, csv_path


def convert(work: Path, path: Path, fmt: str) -> dict:
    spec = {"model": {"name": "mlp"}, "data": {"path": str(path), "format": fmt, "batchSize": 64,
                                               "featureColumns": [f"f{i}" for i in range(FEATURES)]}}  # fmt: skip
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", CONVERT, json.dumps(spec), str(work / f"cache-{fmt}")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = 0.0
    while p.poll() is None:
        try:
            peak = max(peak, peak_rss_mb(p.pid))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.05)
    out, err = p.communicate()
    if p.returncode:
        raise SystemExit(f"{fmt}: exit {p.returncode}\n{err[-3000:]}")
    return {"format": fmt, "file_gb": path.stat().st_size / 1e9, "peak_rss_mb": peak,
            "wall_s": time.monotonic() - t0, **json.loads(out.strip().splitlines()[-1])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8_000_000)
    ap.add_argument("--work", type=Path, help="a folder for the files (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        pq_path, csv_path = write_files(work, args.rows)
        print(f"files written in {time.monotonic() - t0:.0f} s", flush=True)
        results = [convert(work, pq_path, "parquet"), convert(work, csv_path, "csv")]
    print(f"\n{'format':<9}{'file (GB)':>10}{'rows':>11}{'peak RSS (MB)':>15}{'wall (s)':>10}")
    for r in results:
        print(f"{r['format']:<9}{r['file_gb']:>10.2f}{args.rows:>11}{r['peak_rss_mb']:>15.0f}{r['wall_s']:>10.0f}")


if __name__ == "__main__":
    main()
