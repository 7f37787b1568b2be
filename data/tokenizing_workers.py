"""Pre-tokenizing a corpus in worker processes that import only the `tokenizers` library.

`SentenceIds` computes what the pre-tokenized cache stores for a sentence (the sentence rule applied, tokenized without
special tokens, cut to `keep` ids) from a fast tokenizer's Rust backend, exactly as the transformers tokenizer does it
(`TokenizersBackend._encode_plus`: `encode_batch` with truncation and padding off, `encode_special_tokens` set from
`split_special_tokens`; tests/data/test_pretokenized.py compares the two), so it needs neither transformers nor torch.

`TokenizingWorkers` runs it in `python -m promptemb.data.tokenizing_workers` processes fed batches over pipes, in
order: each worker costs the interpreter, numpy and the tokenizer (tens of MB), where a process forked from the
trainer would count the trainer's memory again, and reading the corpus is left to the caller, who streams it from
disk (a worker reading a memory-mapped table keeps every page it touched mapped, so its memory would grow with the
corpus).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from promptemb.encoder.template import apply_sentence_rule


@dataclass(frozen=True)
class SentenceIds:
    """Sentences -> stored ids with a fast tokenizer's backend (its `to_str()` serialisation)."""

    backend: str
    split_special_tokens: bool
    sentence_rule: str | None  # None: the form has no template, so no sentence rule
    leading_space: bool
    keep: int
    _tokenizer: list = field(default_factory=list, compare=False, repr=False)  # the backend, built once per process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokenizer": []}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def tokenizer(self):
        if not self._tokenizer:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self.backend)
            tokenizer.no_truncation()
            tokenizer.no_padding()
            tokenizer.encode_special_tokens = self.split_special_tokens
            self._tokenizer.append(tokenizer)
        return self._tokenizer[0]

    def __call__(self, sentences: list[str]) -> list[list[int]]:
        if self.sentence_rule is not None:
            sentences = [apply_sentence_rule(sentence, self.sentence_rule) for sentence in sentences]
        if self.leading_space:
            sentences = [" " + sentence for sentence in sentences]
        return [encoding.ids[: self.keep] for encoding in self.tokenizer().encode_batch(sentences,
                                                                                       add_special_tokens=False)]

    def flat(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(offsets [n + 1] int32, ids int32): the ids of every sentence, concatenated (an Arrow list array's
        buffers)."""
        ids = self(sentences)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int32, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter((token for row in ids for token in row), dtype=np.int32, count=int(offsets[-1]))
        return offsets, values


class TokenizingWorkers:
    """`processes` workers, each computing `ids.flat` on the batches it is sent; `map` yields the results in the
    order of the batches. A context manager: the workers end with it, whatever happens."""

    def __init__(self, ids: SentenceIds, processes: int):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",  # one core per worker
               "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # where this process found us
        self.workers = [subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env) for _ in range(processes)]
        for worker in self.workers:
            pickle.dump(ids, worker.stdin)
            worker.stdin.flush()

    def __enter__(self) -> TokenizingWorkers:
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            for stream in (worker.stdin, worker.stdout):
                with contextlib.suppress(OSError):  # a worker that died has closed its end
                    stream.close()
        for worker in self.workers:
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    def map(self, batches: Iterable[list[list[str]]]) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        """For each batch (a list of sentences per column) the flat ids of each column, in order. Batch i goes to
        worker i mod n, which holds at most one batch at a time, so no pipe can fill both ways."""
        pending: list[bool] = [False] * len(self.workers)
        index = 0
        for index, batch in enumerate(batches):
            slot = index % len(self.workers)
            if pending[slot]:
                yield self._receive(slot)
            self._send(slot, batch)
            pending[slot] = True
        count = len(self.workers)
        for slot in [(index + 1 + k) % count for k in range(count)]:  # the oldest first
            if pending[slot]:
                yield self._receive(slot)

    def _send(self, slot: int, batch: list[list[str]]) -> None:
        worker = self.workers[slot]
        try:
            pickle.dump(batch, worker.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            worker.stdin.flush()
        except BrokenPipeError:
            raise OSError(f"pre-tokenizing worker {worker.pid} ended (exit {worker.wait()})") from None

    def _receive(self, slot: int):
        worker = self.workers[slot]
        try:
            result = pickle.load(worker.stdout)
        except EOFError:
            raise OSError(f"pre-tokenizing worker {worker.pid} ended (exit {worker.wait()})") from None
        if isinstance(result, str):
            raise RuntimeError(f"pre-tokenizing worker {worker.pid}: {result}")
        return result


def serve() -> None:
    """A worker: the SentenceIds, then batches until the pipe closes. The protocol has the real stdout to itself;
    anything printed goes to stderr. Ctrl-C reaches the whole process group: the parent answers it (in one line) and
    closes the pipes, which ends the worker without a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    ids = pickle.load(requests)
    while True:
        try:
            batch = pickle.load(requests)
        except EOFError:
            return
        try:
            result = [ids.flat(column) for column in batch]
        except Exception as err:  # sent back: the parent raises it with the worker's id
            result = f"{type(err).__name__}: {err}"
        pickle.dump(result, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()


if __name__ == "__main__":
    serve()
