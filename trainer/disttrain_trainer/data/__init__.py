"""Training data: the built-in datasets and your own files, local or on object storage.

    loading.py     load_dataset(spec): the table of readers by format and source
    source.py      where spec.data.path lies (local, s3://)
    formats/       one reader per format (tokens, npy, npz, parquet, jsonl, csv, hfdataset,
                   imagefolder, module, text; tokens_s3: token objects read in place)
    builtin.py     digits, pytext, synthetic, packed into shards
    rows.py, lm.py classification rows and language-model windows: checks, split, Dataset
    convert.py     conversion of the formats that are not read in place, in record batches
    arrays.py      memory-mapped row sources
    dataset.py     Dataset (what a rank reads a batch from), next_batch
    sampler.py     GlobalBatchSampler: deterministic, resumable, world-size independent
    permutation.py a seeded permutation evaluated per index (the sampler's order, the split)
    cache.py       the data cache: on the checkpoint volume, each entry built once per job
    object_store.py  s3:// access, clear errors, staging (also used by checkpoints/remote.py)
"""

from __future__ import annotations

from .builtin import corpus_text, vocabulary
from .dataset import Dataset, next_batch
from .loading import load_dataset
from .sampler import GlobalBatchSampler

__all__ = ["Dataset", "GlobalBatchSampler", "corpus_text", "load_dataset", "next_batch", "vocabulary"]
