"""The flags of the programs this one's users come from (CleanRL, rl-zoo and Stable-Baselines3's names, LeanRL,
Lightning's recurrent example, sheeprl's overrides), and what this program calls each: an unknown flag or `--config`
key that one of them takes is answered with this program's own."""

from __future__ import annotations

from dataclasses import dataclass

from rl.errors import UsageError, unrecognized_options


@dataclass(frozen=True)
class PeerFlag:
    program: str
    advice: str  # what to give here instead; `{script}` stands for the entry script's name
    flag_here: str | None = None  # the flag the advice names: the hint is given only where the algorithm takes it
    algorithm: str | None = None  # the one algorithm the advice holds for, where it is one
    kind: str = "flag"
    python: str | None = None  # the advice to code that builds a config, where the flags' form does not carry over


TUNING = "python -m rl.tune --trials N -- TRAINING FLAGS (sac first for SAC)"

PEER_FLAGS: dict[str, PeerFlag | tuple[PeerFlag, ...]] = {  # a tuple: the advice for each algorithm
    # CleanRL's scripts (LeanRL's share them).
    "--track": PeerFlag(
        "CleanRL",
        "--logger tensorboard wandb logs to Weights & Biases as well",
        "--logger",
        python='logger=("tensorboard", "wandb") logs to Weights & Biases as well',
    ),
    "--wandb-project-name": PeerFlag(
        "CleanRL", "set WANDB_PROJECT in the environment, with --logger wandb", "--logger"
    ),
    "--wandb-entity": PeerFlag("CleanRL", "set WANDB_ENTITY in the environment, with --logger wandb", "--logger"),
    "--num-minibatches": PeerFlag(
        "CleanRL",
        "give the minibatch's size instead: --per-rank-batch-size, num_envs x num_steps / num_minibatches",
        "--per-rank-batch-size",
    ),
    "--norm-adv": PeerFlag("CleanRL", "--normalize-advantages", "--normalize-advantages"),
    "--no-norm-adv": PeerFlag("CleanRL", "--no-normalize-advantages", "--normalize-advantages"),
    "--alpha": PeerFlag("CleanRL", "--ent-coef 0.2 fixes the temperature at 0.2", "--ent-coef", "sac"),
    "--autotune": PeerFlag("CleanRL", "--ent-coef auto (the default) tunes the temperature", "--ent-coef", "sac"),
    "--no-autotune": PeerFlag("CleanRL", "--ent-coef 0.2 fixes the temperature (at 0.2, say)", "--ent-coef", "sac"),
    "--save-model": PeerFlag("CleanRL", "every run saves its agent as RUN/agent.ckpt"),
    "--cudagraphs": PeerFlag("LeanRL", "--cuda-graphs", "--cuda-graphs"),
    # Lightning's recurrent PPO example.
    "--mask-vel": PeerFlag(
        "the Lightning example",
        "--env-id rl/MaskedCartPole-v1, or --preset masked-cartpole (with its LSTM)",
        "--env-id",
    ),
    "--envs-batch-size": PeerFlag(
        "the Lightning example",
        "--per-rank-batch-size, in rows: envs_batch_size x num_steps with --recurrent",
        "--per-rank-batch-size",
    ),
    # rl-zoo's train.py.
    "--algo": PeerFlag(
        "rl-zoo", "name the algorithm first: {script} sac --...", python='rl.SACConfig(...), or rl.preset("sac/NAME")'
    ),
    "--env": PeerFlag("rl-zoo", "--env-id", "--env-id"),
    "-n": PeerFlag("rl-zoo", "--total-timesteps", "--total-timesteps"),
    "--n-timesteps": PeerFlag("rl-zoo", "--total-timesteps", "--total-timesteps"),
    "--eval-freq": PeerFlag(
        "rl-zoo",
        "--eval-every, in env steps across all processes (keeping the best agent as best.ckpt)",
        "--eval-every",
    ),
    "--save-freq": PeerFlag("rl-zoo", "--checkpoint-every, in env steps (8192) or time (10m)", "--checkpoint-every"),
    "-f": PeerFlag("rl-zoo", "--log-dir", "--log-dir"),
    "--log-folder": PeerFlag("rl-zoo", "--log-dir", "--log-dir"),
    "-tb": PeerFlag("rl-zoo", "--log-dir: each run's TensorBoard logs are in its folder there", "--log-dir"),
    "--tensorboard-log": PeerFlag(
        "rl-zoo", "--log-dir: each run's TensorBoard logs are in its folder there", "--log-dir"
    ),
    "-params": PeerFlag("rl-zoo", "give each as its flag (--num-envs 4), or a file of them with --config", "--config"),
    "--hyperparams": PeerFlag(
        "rl-zoo", "give each as its flag (--num-envs 4), or a file of them with --config", "--config"
    ),
    "-conf": PeerFlag("rl-zoo", "--config FILE, a YAML or JSON file of this program's flags", "--config"),
    "--conf-file": PeerFlag("rl-zoo", "--config FILE, a YAML or JSON file of this program's flags", "--config"),
    "--vec-env": PeerFlag("rl-zoo", "--vector-mode async (subproc) or sync (dummy)", "--vector-mode"),
    "--device": PeerFlag("rl-zoo", "--cuda trains on the GPU", "--cuda"),
    "--num-threads": PeerFlag("rl-zoo", "--torch-threads, each process's", "--torch-threads"),
    "--progress": PeerFlag(
        "rl-zoo", "the progress bar shows by default (--no-progress-bar hides it)", "--progress-bar"
    ),
    "-optimize": PeerFlag("rl-zoo", TUNING),
    "--optimize": PeerFlag("rl-zoo", TUNING),
    "--optimize-hyperparameters": PeerFlag("rl-zoo", TUNING),
    "--n-trials": PeerFlag("rl-zoo", TUNING),
    "-i": PeerFlag("rl-zoo", "--resume-from RUN/checkpoints/FILE continues a run from its checkpoint", "--resume-from"),
    "--trained-agent": PeerFlag(
        "rl-zoo", "--resume-from RUN/checkpoints/FILE continues a run from its checkpoint", "--resume-from"
    ),
    # Stable-Baselines3's hyperparameter names, as rl-zoo's files and --hyperparams give them.
    "--n-envs": PeerFlag("Stable-Baselines3", "--num-envs", "--num-envs"),
    "--n-steps": PeerFlag("Stable-Baselines3", "--num-steps", "--num-steps"),
    "--n-epochs": PeerFlag("Stable-Baselines3", "--update-epochs", "--update-epochs"),
    "--clip-range": PeerFlag("Stable-Baselines3", "--clip-coef", "--clip-coef"),
    "--normalize-advantage": PeerFlag("Stable-Baselines3", "--normalize-advantages", "--normalize-advantages"),
    "--policy": PeerFlag(
        "Stable-Baselines3", "--encoder mlp or cnn; auto, the default, follows the observations", "--encoder"
    ),
    "--normalize": PeerFlag(
        "Stable-Baselines3", "--normalize-observations and --normalize-rewards", "--normalize-observations"
    ),
    "--normalize-kwargs": PeerFlag(
        "Stable-Baselines3", "--normalize-observations and --normalize-rewards", "--normalize-observations"
    ),
    "--batch-size": PeerFlag(
        "Stable-Baselines3",
        "--per-rank-batch-size is PPO's minibatch size (on each process)",
        "--per-rank-batch-size",
        "ppo",
    ),
    "--learning-rate": PeerFlag(
        "Stable-Baselines3", "give SAC's two rates, --policy-lr and --q-lr (the same value for both)", "--q-lr", "sac"
    ),
    "--policy-kwargs": (
        PeerFlag(
            "Stable-Baselines3",
            "give its entries as flags: net_arch as --hidden-size, activation_fn as --activation-function, "
            "log_std_init as --log-std-init, ortho_init as --ortho-init",
            "--hidden-size",
            "ppo",
        ),
        PeerFlag(
            "Stable-Baselines3",
            "give its entries as flags: net_arch as --net-arch, log_std_init as --log-std-init",
            "--net-arch",
            "sac",
        ),
    ),
    "--env-wrapper": PeerFlag(
        "rl-zoo",
        "--time-feature adds sb3_contrib's TimeFeatureWrapper; for another wrapper, register the wrapped env "
        "(gymnasium.register('MyEnv-v0', entry_point=...)) and give --env-id MyEnv-v0",
    ),
    "--callback": PeerFlag("rl-zoo", "give callbacks in Python: rl.train(config, callbacks=[...])"),
}

AGENT_FILE = "give the agent's file first: python -m rl.evaluate RUN/agent.ckpt (or RUN/checkpoints/FILE)"

# rl-zoo's enjoy.py finds the agent from its algorithm, env and experiment, and counts env steps.
EVALUATION_PEER_FLAGS: dict[str, PeerFlag | tuple[PeerFlag, ...]] = {
    "--algo": PeerFlag("rl-zoo", AGENT_FILE),
    "-f": PeerFlag("rl-zoo", AGENT_FILE),
    "--folder": PeerFlag("rl-zoo", AGENT_FILE),
    "--exp-id": PeerFlag("rl-zoo", AGENT_FILE),
    "--load-checkpoint": PeerFlag("rl-zoo", AGENT_FILE),
    "--load-last-checkpoint": PeerFlag("rl-zoo", AGENT_FILE),
    "--load-best": PeerFlag("rl-zoo", "give the best agent's file: RUN/best.ckpt, kept by --eval-every or --evaluator"),
    "--env": PeerFlag("rl-zoo", "the agent's own env by default; --env-id evaluates on another", "--env-id"),
    "-n": PeerFlag("rl-zoo", "--episodes N counts episodes, not env steps", "--episodes"),
    "--n-timesteps": PeerFlag("rl-zoo", "--episodes N counts episodes, not env steps", "--episodes"),
    "--n-eval-episodes": PeerFlag("Stable-Baselines3", "--episodes", "--episodes"),
    "--eval-episodes": PeerFlag("rl-zoo", "--episodes", "--episodes"),
}

AFTER_DASHES = "the training flags follow --: python -m rl.tune --trials 20 -- {flag} ... (sac first for SAC)"

# rl-zoo's train.py tunes with --optimize; rl.tune takes its own flags, then the training flags after --.
TUNING_PEER_FLAGS: dict[str, PeerFlag | tuple[PeerFlag, ...]] = {
    "--n-trials": PeerFlag("rl-zoo", "--trials", "--trials"),
    "--max-total-trials": PeerFlag("rl-zoo", "--trials, which counts the study's earlier trials", "--trials"),
    "--n-jobs": PeerFlag("rl-zoo", "--workers, a process each", "--workers"),
    "--n-evaluations": PeerFlag("rl-zoo", "--eval-every, in env steps between a trial's evaluations", "--eval-every"),
    "--optimization-log-path": PeerFlag("rl-zoo", "--out", "--out"),
    "-optimize": PeerFlag("rl-zoo", "rl.tune always tunes"),
    "--optimize": PeerFlag("rl-zoo", "rl.tune always tunes"),
    "--optimize-hyperparameters": PeerFlag("rl-zoo", "rl.tune always tunes"),
    "--algo": PeerFlag("rl-zoo", AFTER_DASHES.format(flag="--env-id ENV")),
    "--env": PeerFlag("rl-zoo", AFTER_DASHES.format(flag="--env-id ENV")),
    "-n": PeerFlag("rl-zoo", AFTER_DASHES.format(flag="--total-timesteps N")),
    "--n-timesteps": PeerFlag("rl-zoo", AFTER_DASHES.format(flag="--total-timesteps N")),
}

# sbatch's options: the ones rl.slurm sets have its own flag; the others sbatch adds to the script's.
SBATCH_OWN_OPTIONS = (
    "-p --partition -A --account -q --qos --mem --mem-per-cpu -C --constraint -o --output -e --error "
    "--mail-type --mail-user --exclusive --reservation"
).split()
SBATCH_PEER_FLAGS: dict[str, PeerFlag | tuple[PeerFlag, ...]] = {
    "-N": PeerFlag("sbatch", "--nodes", "--nodes"),
    "--ntasks-per-node": PeerFlag(
        "sbatch",
        "--processes-per-node (the script starts one launcher per node, which starts them)",
        "--processes-per-node",
    ),
    "--gres": PeerFlag("sbatch", "--gpus-per-node N", "--gpus-per-node"),
    "--gpus": PeerFlag("sbatch", "--gpus-per-node N", "--gpus-per-node"),
    "--cpus-per-task": PeerFlag("sbatch", "--cpus-per-node", "--cpus-per-node"),
    "-t": PeerFlag("sbatch", "--time", "--time"),
    "-J": PeerFlag("sbatch", "--job-name", "--job-name"),
    **{
        option: PeerFlag("sbatch", f"sbatch takes it beside the script's own: sbatch {option} ... job.sbatch")
        for option in SBATCH_OWN_OPTIONS
    },
}

HYDRA_OVERRIDE = PeerFlag(
    "sheeprl", "give flags (--env-id CartPole-v1), or a YAML file of them with --config", kind="Hydra override"
)


def peer_flag(
    unrecognized: list[str],
    algorithm: str | None,
    flags_here: set[str],
    peers: dict[str, PeerFlag | tuple[PeerFlag, ...]] = PEER_FLAGS,
    hydra: PeerFlag | None = HYDRA_OVERRIDE,
) -> tuple[str, PeerFlag] | None:
    """The first of the `unrecognized` words that another program takes as one of `peers` (or, given `hydra`, a
    Hydra override, `key=value`), and what to give here instead; None where none is, or its advice is not for
    `algorithm` (a flag not in `flags_here`, another algorithm's)."""
    for word in unrecognized:
        if hydra is not None and not word.startswith("-") and "=" in word:
            return word, hydra
        name = word.partition("=")[0]
        for peer in alternatives(peers.get(name)):
            if peer.algorithm in (None, algorithm) and (peer.flag_here is None or peer.flag_here in flags_here):
                return name, peer
    return None


def alternatives(entry: PeerFlag | tuple[PeerFlag, ...] | None) -> tuple[PeerFlag, ...]:
    """A table's entry as the advice it holds, one for each algorithm it holds one for."""
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def tools_peer_flag(
    error: UsageError, peers: dict[str, PeerFlag | tuple[PeerFlag, ...]], flags_here: set[str]
) -> UsageError | None:
    """A tool's parse `error` (rl.evaluate's, rl.tune's, rl.slurm's) for a flag of the program it stands in for,
    answered with the tool's own; None for any other error."""
    found = peer_flag(unrecognized_options(error), None, flags_here, peers, hydra=None)
    if found is None:
        return None
    word, peer = found
    return UsageError(word, f"{peer.program}'s {peer.kind}, not this program's: {peer.advice}")
