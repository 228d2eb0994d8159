"""Host data (the envs' arrays, index lists) onto the training device without making the host wait, and device
data (actions) back with a wait for that copy alone.

A copy from ordinary (pageable) host memory to a GPU is synchronous: the host waits until the
GPU's queue has drained up to it, so its launches and the GPU's work add up instead of
overlapping. Staged through pinned memory, the copy is queued like a kernel and the host goes on.
The staging block comes from torch's caching host allocator, which keeps it until the queued
copy has run, so the caller may change its array at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def to_device(data: np.ndarray | Tensor | Sequence, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """`data` as a tensor on `device` (converted to `dtype` on the host first). On the CPU it shares the
    array's memory where it can, as `torch.as_tensor` does; on a GPU the copy is queued, not waited for."""
    host = torch.as_tensor(data, dtype=dtype)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """A device tensor's copy to the host, queued now and waited for when read.

    `tensor.cpu()` waits for everything queued on the GPU so far; this waits for the work queued
    before the copy alone, so work launched after it (a gradient step) runs on the GPU while the
    host uses the copy (steps the envs with it).
    """

    def __init__(self, tensor: Tensor) -> None:
        self.copied: torch.cuda.Event | None = None
        if tensor.device.type != "cuda":
            self.tensor = tensor.cpu()
            return
        self.tensor = tensor.to("cpu", non_blocking=True)  # into pinned memory: a queued copy
        self.copied = torch.cuda.Event()
        self.copied.record()

    def numpy(self) -> np.ndarray:
        if self.copied is not None:
            self.copied.synchronize()
        return self.tensor.numpy()
