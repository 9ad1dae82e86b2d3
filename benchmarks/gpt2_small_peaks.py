"""gpt2-small's step on this CPU, one per method, its live tensors' peak beside the memory model's
(docs/transformers.md, "What it counts, and how it was checked": the two gpt2-small tables).

    python benchmarks/gpt2_small_peaks.py [--out docs/transformers/peaks-gpt2-small-cpu.json]

B = 2, T = 512, FP32, the logits whole and in chunks; Full ZO, ElasticZO k=1, Full BP with and
without checkpointing. The peak is what the step's tensors held at most beyond the weights and
the batch (workloads/tensor_peak.Live); each row also gives the model's peak, its moment and its
total, all less the parameters and inputs. About five minutes on two cores; the record it writes
is what tests/test_memory_model.py holds the docs' tables to."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from harness.search.memory_model import breakdown  # noqa: E402
from workloads import methods  # noqa: E402
from workloads.clock import NullClock  # noqa: E402
from workloads.models import MODELS  # noqa: E402
from workloads.spec import JobSpec  # noqa: E402
from workloads.tensor_peak import Live  # noqa: E402
from workloads.torch_runner import TorchEngine  # noqa: E402

RECORD = ROOT / "docs" / "transformers" / "peaks-gpt2-small-cpu.json"
MODEL, BATCH, CONTEXT = "gpt2-small", 2, 512
CONFIGS = (("full-zo", 0, False), ("elastic-zo", 1, False), ("full-bp", 0, False), ("full-bp", 0, True))


def row(method: str, k: int, checkpointing: bool, loss_chunk: int) -> dict:
    m = MODELS[MODEL]
    spec = JobSpec.from_dict({"job_id": "peaks", "method": method, "bp_layers": k, "threads": 0,
                              "workload": {"model": m.name, "architecture": m.to_dict(), "dataset": "fortunes"},
                              "hyper": {"checkpointing": checkpointing, "loss_chunk": loss_chunk, "context": CONTEXT}})
    e = TorchEngine(spec, m, m.init_weights(0))
    rng = np.random.default_rng(0)
    x, y = e.load_batch(*(rng.integers(0, m.vocab, (BATCH, CONTEXT)) for _ in range(2)))
    mask, rope = e.net.table(CONTEXT, e.flat)
    with Live(e.flat, x, y, mask, *(rope or ())) as live:
        if e.n_zo:
            methods.zo_step(e, x, y, 5, 1e-3, 5.0, 1e-3, 0.01, NullClock())
        else:
            methods.bp_step(e, x, y, 0.01, NullClock())
    b = breakdown(m, method, BATCH, "fp32", bp_layers=k, checkpointing=checkpointing, loss_chunk=loss_chunk,
                  context=CONTEXT)
    resident = b.parts["parameters"] + b.parts["inputs"]
    return {"method": method, "bp_layers": k, "checkpointing": checkpointing, "loss_chunk": loss_chunk,
            "measured_bytes": live.peak, "peak_bytes": b.peak_bytes - resident, "peak_at": b.peak_at,
            "total_bytes": b.total_bytes - resident}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RECORD)
    args = ap.parse_args(argv)
    rows = []
    for chunk in (-1, 0):
        for method, k, ckpt in CONFIGS:
            rows.append(row(method, k, ckpt, chunk))
            r = rows[-1]
            print(f"{method:10} k={k} ckpt={ckpt!s:5} chunk={chunk:2}: measured {r['measured_bytes'] / 2**20:9.1f} MiB, "
                  f"model {r['peak_bytes'] / 2**20:9.1f} ({r['peak_at']})", flush=True)
    args.out.write_text(json.dumps({"model": MODEL, "batch": BATCH, "context": CONTEXT, "precision": "fp32",
                                    "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
