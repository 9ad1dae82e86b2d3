"""Debian's fortune cookies as the token files the transformers train on: the text data sets
`fortunes` (language modelling) and `fortunes-topics` (which file an entry comes from).

The text is the `fortunes` package's, so a machine with apt has it and nothing is downloaded
at run time. Only the host runs this (harness/preparation/artifacts.py writes the files once): the BPE
tokenizer is trained with Hugging Face's `tokenizers`, which no board has, and the runners read
the token ids as IDX files with numpy (workloads/datasets.py).

Everything here is a function of the corpus's bytes: its files are read in sorted order and
their entries in file order, every TEST_EVERY-th entry of that sequence is a test entry, and
each split is stored in a fixed zobench-z shuffle (so the first train_samples entries, or
the first sequences of the stream, mix the topics). The BPE trainer has no randomness and
breaks ties in pair counts by token id, and a byte-level model with the whole byte alphabet
given assigns those ids in byte order: the same corpus gives the same tokenizer, with any
number of threads (tests/test_text.py makes it twice).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from workloads import zrng
from workloads.datasets import HOW_TO_GET, TEXT_FOLDER, DatasetError
from workloads.models import TEXT_VOCAB

SEPARATOR = "%"                     # a line holding only this ends an entry
EOT = "<|endoftext|>"               # ends every entry in a stream; also the left padding of fortunes-topics
TEST_EVERY = 10
SPLITS = ("train", "test")
SEED = 0
# zobench-z stream of the host's data preparation (the runners use 1-3, pointclouds.py 0x500x)
STREAM_ORDER = 0x5101      # counter = split index: the order entries are stored in


def entries(text: str) -> list[str]:
    """A fortune file's entries, each its lines as they are (newlines kept); blank ones dropped."""
    parts = text.split("\n")     # lines end at newlines only: a form feed inside an entry stays
    out, lines = [], []
    for line in [p + "\n" for p in parts[:-1]] + parts[-1:]:
        if line.rstrip("\r\n") == SEPARATOR:
            out.append("".join(lines))
            lines = []
        else:
            lines.append(line)
    out.append("".join(lines))
    return [e for e in out if e.strip()]


def read_corpus(sources: dict[Path, bytes]) -> tuple[list[str], list[tuple[int, str]]]:
    """The topics (the files' names) and every entry as (topic index, text), in corpus order,
    from each fortune file's bytes (topic_files' order)."""
    topics, out = [], []
    for f, blob in sources.items():
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(f"dataset {TEXT_FOLDER!r}: {f} is not UTF-8 text ({e})") from None
        out += [(len(topics), e) for e in entries(text)]
        topics.append(f.name)
    return topics, out


def split_entries(corpus: list[tuple[int, str]]) -> dict[str, list[tuple[int, str]]]:
    """Every TEST_EVERY-th entry of the corpus is a test entry (each topic split about 9:1);
    both splits in corpus order."""
    return {"train": [e for k, e in enumerate(corpus) if k % TEST_EVERY != TEST_EVERY - 1],
            "test": [e for k, e in enumerate(corpus) if k % TEST_EVERY == TEST_EVERY - 1]}


def stored_order(split: str, n: int) -> np.ndarray:
    """A fixed shuffle of a split's n entries, so a job's first samples mix the topics."""
    return np.argsort(zrng.bits(zrng.stream_key(SEED, STREAM_ORDER, SPLITS.index(split)), 0, n), kind="stable")


def train_tokenizer(texts: list[str], vocab: int = TEXT_VOCAB) -> Tokenizer:
    """Byte-level BPE as GPT-2's (every byte a token, so any text encodes and decodes back
    exactly; no prefix space, so an entry decodes to its own text), EOT its one special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok


@dataclass
class Tokenised:
    """What the host writes for the text data sets (datasets.py reads it)."""
    tokenizer: str      # the tokenizer's JSON, for decoding what a model writes
    manifest: dict      # datasets.MANIFEST: topics, vocabulary, the pad id, sizes
    # split -> datasets.TEXT_FILES kind -> array: "tokens" int32 [n] the stream, each entry's ids
    # then EOT; "entries" int32 [N, 2] each entry's first token in it and count without EOT;
    # "labels" uint8 [N] each entry's topic
    splits: dict[str, dict[str, np.ndarray]]


def tokenise(sources: dict[Path, bytes]) -> Tokenised:
    """The corpus (each fortune file's bytes, topic_files' order) split, a tokenizer trained on
    the train entries alone (in corpus order: the test entries stay unseen), and both splits'
    entries as token ids in their stored order."""
    topics, corpus = read_corpus(sources)
    if not 2 <= len(topics) <= 256:     # a classifier needs two topics; a label is a byte
        raise DatasetError(f"dataset {TEXT_FOLDER!r}: {len(topics)} fortune files, expected 2 to 256 topics; "
                           f"{HOW_TO_GET[TEXT_FOLDER]}")
    split = split_entries(corpus)
    tok = train_tokenizer([text for _, text in split["train"]])
    eot = tok.token_to_id(EOT)
    out = {}
    for name in SPLITS:
        split[name] = [split[name][j] for j in stored_order(name, len(split[name]))]
        ids = [e.ids for e in tok.encode_batch([text for _, text in split[name]])]
        counts = np.array([len(i) for i in ids], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(counts + 1)[:-1]])
        stream = np.fromiter((t for i in ids for t in (*i, eot)), dtype=np.int32, count=int((counts + 1).sum()))
        out[name] = {"tokens": stream, "entries": np.stack([starts, counts], axis=1).astype(np.int32),
                     "labels": np.array([topic for topic, _ in split[name]], dtype=np.uint8)}
    folders = sorted({str(f.parent) for f in sources})
    manifest = {"source": f"Debian's fortunes package ({', '.join(folders)})", "topics": topics,
                "vocab": tok.get_vocab_size(), "eot": eot, "pad": eot, "tokenizers": tokenizers.__version__,
                "test_every": TEST_EVERY,
                "entries": {s: len(out[s]["labels"]) for s in SPLITS},
                "tokens": {s: len(out[s]["tokens"]) for s in SPLITS}}
    return Tokenised(tok.to_str(), manifest, out)
