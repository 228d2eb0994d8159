"""Distributed PPO on Lightning Fabric and raw torch.distributed."""

import time

# When this process started its Python work: the end-of-run summary reports the time since.
PROCESS_STARTED = time.monotonic()
