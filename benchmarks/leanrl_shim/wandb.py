"""Stands in for wandb when `benchmarks/gpu.py --leanrl` runs LeanRL's scripts: it prints the speed they log
(env steps/s after their burn-in) and keeps nothing else."""


def init(*args: object, **kwargs: object) -> None:
    return None


def log(values: dict, step: int | None = None) -> None:
    if "speed" in values:
        print(f"leanrl speed: {float(values['speed']):.1f} at step {step}", flush=True)
