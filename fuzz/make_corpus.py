#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (fuzz/corpus/<harness>/) from the protocol's
own encoders (clients/python/infeed/protocol.py) and a real checkpoint. Run again when the
formats change: python3 fuzz/make_corpus.py build/host/infeedd"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "clients" / "python"))
import numpy as np  # noqa: E402
from infeed import protocol as P  # noqa: E402

SCHEMA = [P.schema_entry("x", "float32", [3]), P.schema_entry("y", "int32", [])]


def frames(*fs):
    return b"".join(struct.pack("<H", len(f)) + f for f in fs)


def write(harness, name, data):
    d = HERE / "corpus" / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def batch(seq, rows=4, bad=None):
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) / 7
    if bad is not None:
        x[rows - 1, 2] = bad
    y = (np.arange(rows) % 4).astype(np.int32)
    return P.pack_batch_header(seq, rows, 2, 0), x.tobytes(), y.tobytes()


def main():
    rid = b"\x00rid01"
    hello = P.hello_frames(SCHEMA, "loader-0")
    write("fuzz_ingest", "hello", frames(rid, *hello))
    write("fuzz_ingest", "hello_anon", frames(rid, *P.hello_frames(SCHEMA, None, 5)))
    write("fuzz_ingest", "batch", frames(rid, *batch(0)))
    write("fuzz_ingest", "batch_nan", frames(rid, *batch(1, bad=np.nan)))
    write("fuzz_ingest", "end", frames(rid, *P.end_frames()))
    hello_shm = json.dumps({"name": "loader-1", "schema": SCHEMA, "shm": True}).encode()
    write("fuzz_ingest", "hello_shm", frames(b"\x00rid02", P.pack_header(P.HELLO), hello_shm))
    batch_shm = P.pack_header(10) + struct.pack("<qqII", 0, 8, 0, 1)  # BATCH_SHM: 2 steps at slot 1
    write("fuzz_ingest", "batch_shm", frames(b"\x00rid02", batch_shm))
    write("fuzz_ingest", "control", json.dumps({"cmd": "status"}).encode())
    write("fuzz_wire", "hello_header", P.pack_header(P.HELLO))
    write("fuzz_wire", "batch_header", P.pack_batch_header(7, 4, 2, 0))
    write("fuzz_wire", "end_header", P.end_frames()[0])
    cfg = {"replicas": 2, "program": "mlp", "features": 8, "classes": 3, "hidden": 4,
           "batch_size": 8, "steps": 10, "optimizer": "adam", "check_finite": True,
           "producer_timeout": 5.5, "input_mode": "per-core"}
    write("fuzz_config", "file", json.dumps(cfg).encode())
    write("fuzz_config", "flags", b"{}\0--replicas\0003\0--steps\00010\0--batch-size\0009"
          b"\0--mode=eval\0--max-abs-input\0001e6")
    calls = {"program": "softmax", "features": 3, "classes": 2, "steps": 2,
             "host_calls": {"confidence": ["mean", "histogram:bins=4,range=0:1"], "label": "sum"}}
    write("fuzz_config", "host-calls", json.dumps(calls).encode()
          + b"\0--host-call\0class=top_k:2,label=label,max\0--host-call=loss=last")
    if len(sys.argv) > 1:  # a real checkpoint from a short run of infeedd
        with tempfile.TemporaryDirectory() as tmp:
            ck = Path(tmp) / "ck"
            port = 20000 + os.getpid() % 20000
            d = subprocess.Popen([sys.argv[1], "--listen", f"tcp://127.0.0.1:{port}",
                                  "--publish", "", "--control", "", "--features", "3",
                                  "--classes", "4", "--batch-size", "4", "--steps", "3",
                                  "--optimizer", "momentum", "--checkpoint-dir", str(ck),
                                  "--log-level", "error"])
            from infeed import Producer
            with Producer(f"tcp://127.0.0.1:{port}", name="seed") as p:
                for s in range(3):
                    _, x, y = batch(s)
                    p.send(x=np.frombuffer(x, np.float32).reshape(4, 3),
                           y=np.frombuffer(y, np.int32))
                p.end()
            d.wait(30)
            for f in sorted(ck.iterdir()):
                write("fuzz_checkpoint", f.name, f.read_bytes())
    time.sleep(0)


if __name__ == "__main__":
    main()
