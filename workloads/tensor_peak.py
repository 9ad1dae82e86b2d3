"""The bytes of torch's tensors alive at every op, and their most: what
torch.cuda.max_memory_allocated gives on a GPU, for a CPU, whose allocator keeps no statistics
(and whose resident set also holds what malloc keeps after a free). The memory model's tests
(tests/test_memory_model.py) weigh a step with it, and benchmarks/gpu_scale.py's dry run."""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Live(TorchDispatchMode):
    """The bytes of the storages made while it is active that are alive now (now()), and the
    most at any op (peak); storages of `ignore` (made before) are not counted."""

    def __init__(self, *ignore):
        super().__init__()
        self.ignore = {t.untyped_storage().data_ptr() for t in ignore}
        self.refs, self.peak = {}, 0

    def now(self) -> int:
        self.refs = {p: (r, n) for p, (r, n) in self.refs.items() if not r.expired()}
        return sum(n for _, n in self.refs.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        live = self.now()      # forget the freed first: a new storage may reuse a freed one's address
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not (torch._C._functorch.is_functorch_wrapped_tensor(t) or t._is_zerotensor()):
                s = t.untyped_storage()
                if s.data_ptr() not in self.ignore and s.data_ptr() not in self.refs:
                    self.refs[s.data_ptr()] = StorageWeakRef(s), s.nbytes()
                    live += s.nbytes()
        self.peak = max(self.peak, live)
        return out
