"""Distributed PPO on Lightning Fabric and raw torch.distributed."""
