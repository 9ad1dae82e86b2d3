"""Reports read the store and never write to it (except their own report/ folder)."""


def build(store, run_ids, out=None, **options):
    from .report import build as _build   # seaborn and matplotlib load only when a report is made
    return _build(store, run_ids, out, **options)
