#!/usr/bin/env python3
"""Tokenizes documents into a Megatron indexed dataset (`dtrain data prepare`).

JSONL files (.jsonl/.ndjson: one document per line, its text under --text-key)
or text files (any other name: one document per file) through a `tokenizers`
JSON tokenizer, into PREFIX.bin + PREFIX.idx ("MMIDIDX" version 1, uint16
when the vocabulary has < 65536 ids, else int32; one sequence per document)
and PREFIX.json (tokenizer, vocab_size, eod_id). Files are written under
temporary names and renamed at the end, so a failure or a signal leaves no
PREFIX.* half written. Bad input exits 2 naming the file (and line).
"""
import argparse
import concurrent.futures
import json
import os
import signal
import struct
import sys
import time

import numpy as np

EOD_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]", "<eod>")
DTYPE_CODES = {np.uint16: 8, np.int32: 4}
BATCH_BYTES = 1 << 20


class BadInput(Exception):
    pass


def encode_threads():
    """Threads to tokenize on: the cores this process may run on that the
    1-minute load average leaves free, at least 1. Rayon's pool (what
    encode_batch uses by default) spins on every core and loses to a plain
    loop when the cores are busy."""
    cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, int(cores - os.getloadavg()[0] + 0.5)))


def documents(path, text_key):
    """Yields (text, raw bytes) per document of one input file."""
    if path.endswith((".jsonl", ".ndjson")):
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (ValueError, UnicodeDecodeError) as e:
                    raise BadInput(f"{path}:{lineno}: not JSON ({e})")
                if not isinstance(obj, dict) or text_key not in obj:
                    raise BadInput(f"{path}:{lineno}: no \"{text_key}\" field (--text-key {text_key})")
                if not isinstance(obj[text_key], str):
                    raise BadInput(f"{path}:{lineno}: \"{text_key}\" is {type(obj[text_key]).__name__}, not a string")
                yield obj[text_key], len(raw)
    else:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            yield raw.decode("utf-8"), len(raw)
        except UnicodeDecodeError as e:
            raise BadInput(f"{path}: not UTF-8 text ({e})")


class Progress:
    def __init__(self):
        self.start = self.last = time.monotonic()
        self.docs = self.tokens = self.bytes = 0

    def add(self, docs, tokens, nbytes):
        self.docs += docs
        self.tokens += tokens
        self.bytes += nbytes
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self.show()

    def rate(self):
        return self.bytes / 1e6 / max(time.monotonic() - self.start, 1e-9)

    def show(self, end=""):
        sys.stderr.write(f"\r{self.docs} documents | {self.tokens} tokens | {self.rate():.1f} MB/s{end}")
        sys.stderr.flush()


def write_idx(f, dtype, lengths):
    n = len(lengths)
    lengths = np.asarray(lengths, dtype=np.int32)
    pointers = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    f.write(b"MMIDIDX\x00\x00")
    f.write(struct.pack("<Q", 1))
    f.write(struct.pack("<B", DTYPE_CODES[dtype]))
    f.write(struct.pack("<Q", n))
    f.write(struct.pack("<Q", n + 1))
    f.write(lengths.tobytes(order="C"))
    f.write(pointers.tobytes(order="C"))
    f.write(np.arange(n + 1, dtype=np.int64).tobytes(order="C"))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--text-key", default="text")
    p.add_argument("--append-eod", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("inputs", nargs="+")
    a = p.parse_args()

    threads = encode_threads()
    # encode_batch then runs on the calling thread with the GIL released:
    # our own threads, one chunk of a batch each, are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    try:
        tok = Tokenizer.from_file(a.tokenizer)
    except Exception as e:  # tokenizers raises plain Exception on a bad file
        raise BadInput(f"{a.tokenizer}: not a tokenizers JSON file ({str(e).splitlines()[0] if str(e) else e})")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab < 65536 else np.int32
    eod = next((tok.token_to_id(t) for t in EOD_NAMES if tok.token_to_id(t) is not None), None)
    if a.append_eod and eod is None:
        raise BadInput(f"{a.tokenizer}: --append-eod, but the tokenizer has none of {', '.join(EOD_NAMES)}")
    for path in a.inputs:
        if not os.path.isfile(path):
            raise BadInput(f"{path}: no such file")

    final = {ext: a.output + ext for ext in (".bin", ".idx", ".json")}
    tmp = {ext: f"{os.path.dirname(path) or '.'}/.{os.path.basename(path)}.tmp-{os.getpid()}"
           for ext, path in final.items()}

    def cleanup():
        for t in tmp.values():
            try:
                os.unlink(t)
            except FileNotFoundError:
                pass

    def on_signal(sig, _frame):
        cleanup()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        lengths = []
        progress = Progress()
        sys.stderr.write(f"tokenizing on {threads} thread(s) ({len(os.sched_getaffinity(0))} cores, "
                         f"load average {os.getloadavg()[0]:.1f})\n")
        pool = concurrent.futures.ThreadPoolExecutor(threads) if threads > 1 else None
        with open(tmp[".bin"], "wb") as bin_f:
            batch, batch_bytes = [], 0

            def encode(docs):
                if pool is None:
                    return tok.encode_batch(docs)
                step = (len(docs) + threads - 1) // threads
                chunks = [docs[i:i + step] for i in range(0, len(docs), step)]
                return [enc for part in pool.map(tok.encode_batch, chunks) for enc in part]  # in order

            def flush():
                # One array per batch: per-document numpy calls cost more than the writes.
                flat = []
                for enc in encode(batch):
                    flat.extend(enc.ids)
                    if a.append_eod:
                        flat.append(eod)
                    lengths.append(len(enc.ids) + (1 if a.append_eod else 0))
                bin_f.write(np.asarray(flat, dtype=dtype).tobytes())
                progress.add(len(batch), len(flat), 0)
                batch.clear()

            for path in a.inputs:
                for text, nbytes in documents(path, a.text_key):
                    batch.append(text)
                    batch_bytes += nbytes
                    if batch_bytes >= BATCH_BYTES:
                        progress.add(0, 0, batch_bytes)
                        flush()
                        batch_bytes = 0
            progress.add(0, 0, batch_bytes)
            flush()
            bin_f.flush()
            os.fsync(bin_f.fileno())
        if max(lengths, default=0) >= 2**31:
            raise BadInput(f"{a.inputs[0]}: a document of {max(lengths)} tokens does not fit the index's int32 lengths")
        with open(tmp[".idx"], "wb") as f:
            write_idx(f, dtype, lengths)
            os.fsync(f.fileno())
        record = {"tokenizer": os.path.abspath(a.tokenizer), "vocab_size": vocab, "eod_id": eod,
                  "append_eod": a.append_eod, "dtype": np.dtype(dtype).name, "documents": len(lengths),
                  "tokens": int(sum(lengths)), "inputs": [os.path.abspath(x) for x in a.inputs]}
        with open(tmp[".json"], "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
            os.fsync(f.fileno())
        # .idx last: a reader never sees a new index over an old .bin.
        for ext in (".json", ".bin", ".idx"):
            if a.force:
                os.replace(tmp[ext], final[ext])
            else:
                try:
                    os.link(tmp[ext], final[ext])  # fails on an existing name, never replaces
                except FileExistsError:
                    raise BadInput(f"{final[ext]}: appeared while preparing; pass --force to replace it")
                os.unlink(tmp[ext])
        progress.show(end="\n")
        docs, tokens = len(lengths), int(sum(lengths))
        secs = time.monotonic() - progress.start
        print(f"prepared {a.output}.bin/.idx/.json: {docs} documents, {tokens} tokens, "
              f"{tokens / max(docs, 1):.1f} tokens/document ({np.dtype(dtype).name}, vocab {vocab}, eod {eod}); "
              f"{progress.bytes / 1e6:.2f} MB in {secs:.2f} s, {progress.bytes / 1e6 / max(secs, 1e-9):.2f} MB/s, "
              f"{tokens / max(secs, 1e-9):.0f} tokens/s")
    finally:
        cleanup()


if __name__ == "__main__":
    try:
        main()
    except BadInput as e:
        sys.stderr.write(f"\ndtrain: error: {e}\n")
        sys.exit(2)
