"""Reports read the store and never write to it (except their own report/ folder)."""


def build(store, run_ids, out=None):
    from .report import build as _build
    return _build(store, run_ids, out)
