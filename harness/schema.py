"""Checks that a result file follows schema 1 (DESIGN.md) before it enters the store."""
from __future__ import annotations

from workloads import vocab

NUMBER = (int, float)
REQUIRED = {
    "schema": int, "job": dict, "status": str, "started_at": str, "wall_seconds": NUMBER,
    "train_seconds": NUMBER, "steps": int, "phases": dict, "epochs": list, "memory": dict,
    "env": dict,
}


def problems(r) -> list[str]:
    """What is wrong with result r (empty when it is valid)."""
    if not isinstance(r, dict):
        return ["not a JSON object"]
    out = []
    for key, kind in REQUIRED.items():
        if key not in r:
            out.append(f"missing {key}")
        elif not isinstance(r[key], kind) or isinstance(r[key], bool):
            out.append(f"{key} has the wrong type")
    if out:
        return out
    if r["schema"] != 1:
        out.append(f"schema {r['schema']} is not 1")
    if r["status"] not in vocab.STATUSES:
        out.append(f"unknown status {r['status']!r}")
    if "error" not in r or not (r["error"] is None or isinstance(r["error"], str)):
        out.append("error must be null or a string")
    for name, p in r["phases"].items():
        if name not in vocab.PHASES:
            out.append(f"unknown phase {name!r}")
        elif not isinstance(p, dict) or not isinstance(p.get("seconds"), NUMBER) or not isinstance(p.get("calls"), int):
            out.append(f"phase {name} needs seconds and calls")
    for key in ("peak_rss_bytes", "baseline_rss_bytes"):
        if not isinstance(r["memory"].get(key), int):
            out.append(f"memory.{key} must be an integer")
    for e in r["epochs"]:
        if not isinstance(e, dict) or not {"epoch", "seconds", "train_loss"} <= set(e):
            out.append("an epoch record lacks epoch, seconds or train_loss")
            break
    if r["status"] == "ok" and not isinstance(r.get("model"), dict):
        out.append("an ok result needs model")
    return out
