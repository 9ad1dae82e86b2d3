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
    most at any op (peak); storages of `ignore` (made before) are not counted.

    Frees are seen only by asking each storage (a weak reference has no callback on a storage),
    so it is asked at the ops that made a new storage alone: between two of those the live bytes
    only fall, so the peak cannot be passed there. A step's views and in-place ops cost a glance
    at their outputs' addresses, not a walk over every live storage."""

    def __init__(self, *ignore):
        super().__init__()
        self.ignore = {t.untyped_storage().data_ptr() for t in ignore}
        self.refs, self.live, self.peak = {}, 0, 0

    def now(self) -> int:
        dead = [p for p, (r, _) in self.refs.items() if r.expired()]
        for p in dead:
            self.live -= self.refs.pop(p)[1]
        return self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        new = {}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not (torch._C._functorch.is_functorch_wrapped_tensor(t) or t._is_zerotensor()):
                s = t.untyped_storage()
                p = s.data_ptr()
                # a live storage at a known address is that one; an expired one's address reused is new
                if p not in self.ignore and ((old := self.refs.get(p)) is None or old[0].expired()):
                    new[p] = s
        if new:
            self.now()      # forget the freed first: a new storage may reuse a freed one's address
            for p, s in new.items():
                self.refs[p] = StorageWeakRef(s), s.nbytes()
                self.live += s.nbytes()
            self.peak = max(self.peak, self.live)
        return out
