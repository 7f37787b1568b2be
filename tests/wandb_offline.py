"""Read what an offline W&B run wrote (`run-<id>.wandb`): wandb 0.31 ships no reader, so this parses the
LevelDB-log framing (32 KiB blocks, 7-byte chunk headers) and decodes each record with wandb's own protobuf."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes):
    pos, pending = 7, b""  # file header: b":W&B" + 3 bytes (version)
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def read_run(run_dir: Path, timeout: float = 30.0) -> dict:
    """{"config": {key: value}, "history": [{key: value}, ...]} of one finished offline run directory (waits for
    the run's exit record: the W&B service may still be writing the log when `finish()` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        run = _read(run_dir)
        if run["exited"] or time.monotonic() > deadline:
            assert run["exited"], f"{run_dir}: no exit record after {timeout} s"
            return run
        time.sleep(0.2)


def _read(run_dir: Path) -> dict:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    config, history, exited = {}, [], False
    for raw in _chunks(data):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        exited = exited or kind == "exit"
        if kind == "config":
            for item in record.config.update:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return {"config": config, "history": history, "exited": exited}
