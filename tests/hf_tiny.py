"""Tiny Hugging Face artefacts built locally for the tests (nothing is downloaded): a random GPT-2
saved with save_pretrained, a word-level tokenizer trained on a few sentences, token files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 128
POSITIONS = 32
WORDS = (
    "the quick brown fox jumps over a lazy dog while small models learn to predict the next word "
    "from the words before it and every rank reads its own rows of the global batch"
).split()


def save_gpt2(folder: Path, *, seed: int = 0, vocab: int = VOCAB, dropout: float = 0.0) -> Path:
    """Without dropout by default: runs at different world sizes draw different dropout masks."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=POSITIONS,
                        bos_token_id=0, eos_token_id=1, resid_pdrop=dropout, embd_pdrop=dropout,
                        attn_pdrop=dropout)  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(str(folder))
    return folder


def save_tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer over WORDS (ids < VOCAB), with [UNK] and an end-of-sequence token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]").save_pretrained(str(folder))
    return folder


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 15)))) for _ in range(n)]


def write_tokens(folder: Path, n: int = 4000, *, vocab: int = VOCAB, seed: int = 0) -> Path:
    """train.bin / val.bin of uint16 ids below `vocab`, with some structure to learn."""
    rng = np.random.default_rng(seed)
    ids = (np.cumsum(rng.integers(1, 4, size=n + n // 4)) % vocab).astype(np.uint16)
    folder.mkdir(parents=True, exist_ok=True)
    ids[:n].tofile(folder / "train.bin")
    ids[n:].tofile(folder / "val.bin")
    return folder
