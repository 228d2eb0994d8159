"""Decoupled mode: the player/trainer split, its data paths, its equivalence and its failures."""

import csv
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import (
    ENVS_STEPPED,
    SCRIPTS,
    Finished,
    all_scalars,
    child_pids,
    free_port,
    in_wandb_run,
    launch,
    launch_together,
    load_agent,
    rank_pid,
    read_scalars,
    run_dir,
    run_ranks,
    start,
    wait_until_the_run_opens,
    wandb_record,
)

from rl.algos.ppo.algorithm import PPO
from rl.algos.ppo.config import PPOConfig
from rl.algos.ppo.rollout import Batch
from rl.algos.ppo.update import MinibatchSchedule
from rl.batch import Column, RowCodec, TensorBatch, shard_sizes
from rl.cli import prepare
from rl.config import RunConfig
from rl.envs import inspect_env
from rl.errors import UsageError
from rl.modes.decoupled import LOG_SUBDIR
from rl.modes.decoupled_links import (
    Command,
    LagBound,
    PlayerOutbox,
    Topology,
    TrainerInbox,
    WeightsInbox,
    WeightsOutbox,
)

SHORT = ["--total-timesteps", "2048", "--update-epochs", "2", "--eval-episodes", "2", "--no-progress-bar"]


@pytest.mark.parametrize(
    ("nproc", "args"),
    [
        (2, []),
        (3, ["--share-data"]),
        (3, ["--pipeline", "--share-data", "--env-id", "Pendulum-v1", "--normalize-observations"]),
        (4, []),  # 256 rows over 3 trainers: shards of 86, 85 and 85
        (3, ["--vector-mode", "native", "--share-data"]),  # reset steps travel marked
    ],
    ids=[  # several trainers' scatter is in 4-uneven; the lag bound's scatter path in SAC's pipeline test
        *("2-scatter", "3-share", "3-pipeline-share-box"),
        *("4-uneven", "3-native-share"),
    ],
)
def test_player_and_trainers_run_both_data_paths(tmp_path, nproc, args):
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], SHORT + args, tmp_path, nproc=nproc)
    assert finished.returncode == 0, finished.stderr[-3000:]
    directory = run_dir(tmp_path, "decoupled")
    scalars = read_scalars(directory)
    for tag in ("Loss/policy_loss", "Loss/value_loss", "Loss/approx_kl", "Rewards/rew_avg", "Test/return_mean"):
        assert tag in scalars, tag
    assert [step for step, _ in scalars["Loss/policy_loss"]] == [256 * k for k in range(1, 9)]
    lags = [lag for _, lag in scalars["Info/policy_lag"]]
    assert lags == ([0.0] + [1.0] * 7 if "--pipeline" in args else [0.0] * 8)
    assert "evaluation over 2 greedy episodes" in finished.stdout and ENVS_STEPPED.search(finished.stdout)
    waited = re.search(r"; waiting for updates: ([\d.]+) s \(\d+%\)", finished.stdout)  # the lead player's
    assert waited and (float(waited.group(1)) > 0 or "--pipeline" in args)
    assert "policy" in load_agent(directory)
    each_rank = ", ".join(f"{role}: [1-9][0-9]*" for role in ["the player", *(f"trainer {k}" for k in range(1, nproc))])
    assert re.search(rf"^peak RSS per rank \(MB\): {each_rank}$", finished.stdout, re.MULTILINE)
    assert [step for step, _ in scalars["Perf/peak_rss_mb_max"]] == [2048]


def test_trainers_with_a_target_kl_stop_together_at_the_same_minibatch(tmp_path):
    """Two trainers on their own halves of a Pendulum rollout: the stop is the averaged KL's, so theirs agree."""
    args = [*SHORT, "--env-id", "Pendulum-v1", "--per-rank-batch-size", "32", "--target-kl", "0.002"]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    assert finished.returncode == 0, finished.stderr[-3000:]
    scalars = read_scalars(run_dir(tmp_path, "decoupled"))
    stops = scalars["Info/kl_stop_minibatch"] + scalars["Info/kl_stop_epoch"]
    assert len(scalars["Info/kl_stop_minibatch"]) >= 2  # updates that stopped early at this target
    assert all(value == int(value) for _, value in stops)  # a mean over both trainers: whole where they agree


def test_two_players_feed_every_update_with_both_rollouts_as_coupled_ranks_do(tmp_path):
    """Two players and two trainers sharing data train exactly as two coupled ranks sharing data:
    each update holds both players' rollouts of the same weights, each once. Asynchronous with a
    lag bound of 0, the players still never act with weights older than the trainers'."""
    args = [*SHORT, "--share-data", "--torch-threads", "1", "--eval-episodes", "0"]
    (tmp_path / "coupled").mkdir()
    (tmp_path / "decoupled").mkdir()
    players = ["--num-players", "2", "--async", "--max-policy-lag", "0"]
    coupled, decoupled = launch_together(
        ("fabric run", SCRIPTS["fabric"], args, tmp_path / "coupled", 2),
        ("fabric run", SCRIPTS["decoupled"], [*args, *players], tmp_path / "decoupled", 4),
        via=run_ranks,
    )
    assert coupled.returncode == 0 and decoupled.returncode == 0, decoupled.stderr[-3000:]
    coupled_dir, decoupled_dir = run_dir(tmp_path / "coupled", "fabric"), run_dir(tmp_path / "decoupled", "decoupled")
    coupled_agent, decoupled_agent = load_agent(coupled_dir)["policy"], load_agent(decoupled_dir)["policy"]
    assert all(torch.equal(coupled_agent[name], decoupled_agent[name]) for name in coupled_agent)
    for tag in ("Loss/policy_loss", "Loss/value_loss", "Loss/entropy", "Rewards/rew_avg"):  # episodes: all players'
        assert read_scalars(coupled_dir)[tag] == read_scalars(decoupled_dir)[tag], tag
    assert {lag for _, lag in read_scalars(decoupled_dir)["Info/policy_lag_max"]} == {0.0}


ROWS, WIDTH, UPDATES = 7, 4, 3  # a row: one float32, as its 4 bytes


def _exchange(rank: int, port: int, folder: str) -> None:
    """Two players scatter rows that name their player, update and row; two trainers record what they get."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    topology = Topology(rank, 4, torch.device("cpu"), torch.device("cpu"), num_players=2)
    lag = LagBound(0, take_newest=False)
    if topology.is_player:
        outbox = PlayerOutbox(RunConfig(), topology, ROWS, WIDTH, lag)
        for update in range(UPDATES):
            values = torch.tensor([[1000.0 * rank + 100.0 * update + row] for row in range(ROWS)])
            rows = values.view(torch.uint8)
            outbox.send_batch(update + 1, acted_with=update, rows=rows)
        outbox.send_command(Command.STOP, UPDATES + 1)
        outbox.drain()
    else:
        inbox = TrainerInbox(topology, [ROWS, ROWS], WIDTH, share_data=False)
        received = []
        for update in range(UPDATES):
            command, iteration, lag_seen = inbox.receive(updates_done=update)
            assert (command, iteration, lag_seen) == (Command.BATCH, update + 1, 0)
            received.append(inbox.rows.view(torch.float32)[:, 0].clone())
        assert inbox.receive(updates_done=UPDATES)[:2] == (Command.STOP, UPDATES + 1)
        torch.save(received, os.path.join(folder, f"trainer_{rank}.pt"))
    dist.destroy_process_group()


def test_each_update_holds_every_players_rows_exactly_once(tmp_path):
    mp.spawn(_exchange, args=(free_port(), str(tmp_path)), nprocs=4, join=True)
    first, second = torch.load(tmp_path / "trainer_2.pt"), torch.load(tmp_path / "trainer_3.pt")
    for update in range(UPDATES):
        union = sorted(torch.cat([first[update], second[update]]).tolist())
        expected = sorted(1000.0 * player + 100.0 * update + row for player in range(2) for row in range(ROWS))
        assert union == expected  # every row of both players once, none of another update
        assert [len(first[update]), len(second[update])] == [4 + 4, 3 + 3]  # 7 rows split 4/3 by each player


def _arrived(buffer: torch.Tensor, expected: torch.Tensor, seconds: float = 20.0) -> bool:
    """Whether `buffer` comes to hold `expected` (written by a receive posted earlier) within `seconds`."""
    deadline = time.monotonic() + seconds
    while not torch.equal(buffer, expected):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _early_receives(rank: int, port: int, folder: str) -> None:
    """A pipelined player and its trainer: each message must land while its receiver is busy elsewhere."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    topology = Topology(rank, 2, torch.device("cpu"), torch.device("cpu"))
    lag, weights = LagBound(1, take_newest=False), torch.full((5,), 7.0)
    arrived = []
    if topology.is_player:
        outbox, inbox = PlayerOutbox(RunConfig(), topology, ROWS, WIDTH, lag), WeightsInbox(topology, 5, lag, 60.0)
        outbox.send_batch(1, acted_with=0, rows=torch.ones(ROWS, WIDTH, dtype=torch.uint8))
        inbox.catch_up(batches_sent=1, on_update=lambda version, message: None)  # lag 1: nothing to wait for
        arrived.append(_arrived(inbox.message, weights))  # the trainer's update, received while "collecting"
        outbox.send_batch(2, acted_with=0, rows=torch.full((ROWS, WIDTH), 2, dtype=torch.uint8))
        inbox.catch_up(batches_sent=2, on_update=lambda version, message: None, everything=True)
        outbox.send_command(Command.STOP, 3)
        outbox.drain()
    else:
        inbox, outbox = TrainerInbox(topology, [ROWS], WIDTH, share_data=False), WeightsOutbox(topology, 5, lag, 60.0)
        assert inbox.receive(updates_done=0)[:2] == (Command.BATCH, 1)
        outbox.send(weights)
        next_rows = inbox.slots[1 - inbox.current][1]
        arrived.append(_arrived(next_rows, torch.full((ROWS, WIDTH), 2, dtype=torch.uint8)))  # while "training"
        assert inbox.receive(updates_done=1)[:2] == (Command.BATCH, 2)
        outbox.send(weights)
        assert inbox.receive(updates_done=2)[0] == Command.STOP
        outbox.drain()
    torch.save(arrived, os.path.join(folder, f"arrived_{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_messages_arrive_while_their_receivers_compute(tmp_path):
    """The trainer's next rows and the player's next weights travel before their receivers ask for them."""
    mp.spawn(_early_receives, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    assert torch.load(tmp_path / "arrived_0.pt") == [True]  # the player's weights
    assert torch.load(tmp_path / "arrived_1.pt") == [True]  # the trainer's rows


def test_async_players_never_exceed_the_policy_lag_bound(tmp_path):
    """Two SAC players, who step far faster than a gradient step, run ahead as far as allowed and no further.
    (Lag 0 is checked with two PPO players above.)"""
    args = [
        "sac",
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "800",
        "--learning-starts",
        "200",
        "--log-every",
        "100",
        "--batch-size",
        "64",
        "--eval-episodes",
        "0",
        "--no-progress-bar",
        "--num-players",
        "2",
        "--async",
        "--max-policy-lag",
        "3",
    ]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    assert finished.returncode == 0, finished.stderr[-3000:]
    lags = [lag for _, lag in read_scalars(run_dir(tmp_path, "decoupled"))["Info/policy_lag_max"]]
    assert lags and 0 < max(lags) <= 3


def test_a_finished_run_launched_again_only_evaluates_and_reports_no_figures_of_its_own(tmp_path):
    args = [*SHORT, "--run-name", "same"]
    first = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "peak RSS per rank (MB): " in first.stdout
    again = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    printed = again.stdout.splitlines()
    assert printed[0].startswith("this run already trained to step 2,048: nothing is left to train")
    assert not [line for line in printed if line.startswith(("training loop", "peak RSS"))], again.stdout


def test_one_process_is_refused_with_the_command_that_launches_more(tmp_path):
    finished = launch("python", SCRIPTS["decoupled"], [], tmp_path)
    assert finished.returncode == 2
    assert finished.stderr.strip() == (
        "error: --devices: decoupled mode needs at least 2 processes (a player and a trainer), got 1: launch it with "
        f"fabric run --accelerator=cpu --devices=2 {SCRIPTS['decoupled']}"
    )
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("victim", "survivor_says", "extra"),
    [
        pytest.param(2, ["error: the player: ", "trainer 2"], [], marks=pytest.mark.slow),
        (0, ["error: trainer 1: ", "the player"], []),
        pytest.param(2, ["error: the player: ", "the evaluator"], ["--evaluator"], marks=pytest.mark.slow),
        pytest.param(1, ["error: trainer 2: ", "player 1"], ["--num-players", "2"], marks=pytest.mark.slow),
    ],
    ids=["trainer-killed", "player-killed", "evaluator-killed", "second-player-killed"],
)
def test_a_killed_role_ends_the_job_within_60_s(tmp_path, victim, survivor_says, extra):
    args = ["--total-timesteps", "10000000", "--no-progress-bar", *extra]
    job = start("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    try:
        wait_until_the_run_opens(tmp_path, [job])
        time.sleep(1.0)  # well into training
        pid = rank_pid(job.pid, victim)
        assert pid is not None
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        _, stderr = job.communicate(timeout=60)
    finally:
        for pid in child_pids(job.pid):  # never leave a rank behind, whatever happened
            os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert time.monotonic() - killed_at < 60
    assert job.returncode != 0
    said = [line for line in stderr.splitlines() if line.startswith(survivor_says[0])]
    assert said and survivor_says[1] in said[0], stderr[-3000:]


def test_the_evaluator_keeps_the_best_agent_and_never_changes_training(tmp_path):
    args = [*SHORT, "--total-timesteps", "4096", "--eval-episodes", "2", "--torch-threads", "1"]
    (tmp_path / "alone").mkdir(), (tmp_path / "evaluated").mkdir()
    alone = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path / "alone", nproc=2)
    logged = ["--evaluator", "--logger", "tensorboard", "csv", "wandb"]
    evaluated = run_ranks("fabric run", SCRIPTS["decoupled"], [*args, *logged], tmp_path / "evaluated", nproc=3)
    assert alone.returncode == 0 and evaluated.returncode == 0, evaluated.stderr[-3000:]
    alone_dir, evaluated_dir = run_dir(tmp_path / "alone", "decoupled"), run_dir(tmp_path / "evaluated", "decoupled")
    trained, with_evaluator = load_agent(alone_dir)["policy"], load_agent(evaluated_dir)["policy"]
    assert all(torch.equal(trained[name], with_evaluator[name]) for name in trained)  # nobody waited on it
    evaluations = all_scalars(evaluated_dir, "Eval/return_mean")
    # The final weights are always evaluated; how many before them depends on how soon the evaluator is free (its
    # W&B run starts in seconds, training ends in about as many): the resumed run's test in test_loggers.py sees
    # evaluations during training.
    assert max(evaluations) == 4096
    best = torch.load(evaluated_dir / "best.ckpt", weights_only=True)
    assert best["eval_return"] == max(evaluations.values()) and evaluations[best["eval_step"]] == best["eval_return"]
    assert list(all_scalars(evaluated_dir, "Eval/best_return").values())[-1] == best["eval_return"]
    assert all_scalars(evaluated_dir, "Eval/return_std").keys() == evaluations.keys()
    seconds = [value for _, value in sorted(all_scalars(evaluated_dir, "Eval/seconds").items())]
    assert seconds == sorted(seconds) and seconds[0] > 0
    with (evaluated_dir / "csv-evaluator" / "metrics.csv").open(newline="") as file:  # the evaluator's rank logs it
        rows = {int(row["step"]): float(row["Eval/return_mean"]) for row in csv.DictReader(file)}
    assert rows == pytest.approx(evaluations)
    trainers, evaluator = wandb_record(evaluated_dir), wandb_record(evaluated_dir, "evaluator")
    assert b"Eval/return_mean" in evaluator and b"Eval/return_mean" not in trainers  # a W&B run of its own
    assert b"num_envs" in evaluator  # with the run's config
    assert b"Rewards/rew_avg" in trainers
    assert in_wandb_run(trainers, run_group=evaluated_dir.name, job_type="train")  # both in the run's W&B group
    assert in_wandb_run(evaluator, run_group=evaluated_dir.name, job_type="evaluator")
    scored = subprocess.run(
        [sys.executable, "-m", "rl.evaluate", str(evaluated_dir / "best.ckpt"), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scored.returncode == 0, scored.stderr[-2000:]


def test_a_run_folders_broken_best_agent_stops_every_role_with_its_line_before_training(tmp_path):
    best = tmp_path / "logs" / "fabric_decoupled_logs" / "kept" / "best.ckpt"
    best.parent.mkdir(parents=True)
    best.write_bytes(b"not a checkpoint")
    args = [*SHORT, "--evaluator", "--run-name", "kept"]
    finished = run_ranks("fabric run", SCRIPTS["decoupled"], args, tmp_path, nproc=3)
    assert finished.returncode != 0
    refused = (
        "error: --evaluator: logs/fabric_decoupled_logs/kept/best.ckpt is not a checkpoint: torch.save did not write it"
    )
    assert [line for line in finished.stderr.splitlines() if line.startswith("error:")] == [refused] * 3
    assert best.read_bytes() == b"not a checkpoint" and not list(best.parent.glob("checkpoints/*.ckpt"))


@pytest.mark.parametrize(
    ("mode", "nproc", "says"),
    [
        ("decoupled", 2, "--evaluator: needs a third process"),
        ("coupled", 1, "--evaluator: belongs to decoupled mode"),
        ("decoupled", 3, "--evaluator: evaluates --eval-episodes episodes each time"),
    ],
    ids=["two-processes", "coupled", "no-episodes"],
)
def test_the_evaluator_is_refused_where_it_cannot_run(tmp_path, monkeypatch, mode, nproc, says):
    """What every rank checks before training, in this process, as rank 0 of `nproc` would."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(nproc))
    args = ["--evaluator", *(["--eval-episodes", "0"] if nproc == 3 else [])]
    with pytest.raises(UsageError) as refused:
        prepare(args, LOG_SUBDIR, mode=mode)
    assert str(refused.value).startswith(says)


def test_codec_round_trips_every_action_space():
    for env_id, actions in (
        ("CartPole-v1", torch.tensor([0, 1, 1])),
        ("Pendulum-v1", torch.tensor([[0.5], [-2.5], [1.0]])),
    ):
        spaces = inspect_env(env_id)
        codec = PPO(PPOConfig(), spaces).batch_codec()
        batch = Batch(
            obs=torch.randn(3, spaces.obs_dim),
            actions=actions,
            **{name: torch.randn(3) for name in ("logprobs", "values", "advantages", "returns")},
            is_transition=torch.tensor([True, False, True]),
        )
        rows = codec.empty_rows(3)
        codec.pack(batch, rows)
        unpacked = codec.unpack(rows)
        for name in codec.columns:
            assert torch.equal(getattr(unpacked, name), getattr(batch, name)), (env_id, name)


@dataclass
class FlagAndValues(TensorBatch):
    flag: torch.Tensor
    values: torch.Tensor


def test_codec_unpacks_a_single_row_whose_columns_lie_off_their_dtypes_alignment():
    # A row of 1 + 12 bytes: the floats start at byte 1, and the row's width is no multiple of 4. A single
    # row (a recurrent batch of one sequence, a shard of one row) counts as contiguous whatever its stride.
    codec = RowCodec(FlagAndValues, {"flag": Column((1,), torch.bool), "values": Column((3,), torch.float32)})
    batch = FlagAndValues(flag=torch.tensor([[True], [False], [True]]), values=torch.randn(3, 3))
    rows = codec.empty_rows(3)
    codec.pack(batch, rows)
    for picked in (slice(0, 1), slice(1, 2), slice(0, 3), slice(1, 3)):
        unpacked = codec.unpack(rows[picked])
        assert torch.equal(unpacked.flag, batch.flag[picked]), picked
        assert torch.equal(unpacked.values, batch.values[picked]), picked


def test_shards_are_near_equal_and_minibatch_counts_match():
    assert shard_sizes(10, 3) == [4, 3, 3]
    assert sum(shard_sizes(512, 5)) == 512
    schedules = [MinibatchSchedule(rows, 2, 1, 0, seed=0, num_minibatches=2) for rows in shard_sizes(10, 3)]
    epochs = [schedule.next_epoch() for schedule in schedules]
    assert [len(epoch) for epoch in epochs] == [2, 2, 2]  # DDP's collectives stay in step
    assert sorted(i for batch in epochs[0] for i in batch) == [0, 1, 2, 3]


@pytest.mark.slow
def test_normal_exits_are_clean_in_20_of_20_runs(tmp_path):
    variants = [  # (processes, flags): a player and a trainer shut down as many do, so most runs take two
        (2, ["--share-data"]),
        (2, ["--pipeline"]),
        (2, ["--async", "--max-policy-lag", "2"]),
        (3, ["--num-players", "2", "--async"]),
    ]

    def run(attempt: int) -> Finished:
        cwd = tmp_path / str(attempt)
        cwd.mkdir()
        nproc, flags = variants[attempt % len(variants)]
        args = ["--total-timesteps", "1024", "--eval-episodes", "0", "--no-progress-bar", *flags]
        return run_ranks("fabric run", SCRIPTS["decoupled"], args, cwd, nproc=nproc, timeout=180)

    with ThreadPoolExecutor(max_workers=3) as pool:  # three jobs at once: less time, and more contention
        runs = list(pool.map(run, range(20)))
    unclean = [
        (attempt, finished.returncode, finished.stderr[-500:])
        for attempt, finished in enumerate(runs)
        if finished.returncode != 0 or "terminate called" in finished.stderr or "Traceback" in finished.stderr
    ]
    assert unclean == []
