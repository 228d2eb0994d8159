"""What a captured step does that a CPU can check: its outputs' packing, the cut at a collective."""

import json
from pathlib import Path

import torch
import torch.multiprocessing as mp
from conftest import free_port, join_as_rank
from torch import nn

from rl.algos.sac.config import SACConfig
from rl.cuda_graphs import PackedOutputs
from rl.optim import FlatGradients
from rl.runtime import TorchRuntime


def test_packed_outputs_come_back_in_order_as_views_of_one_tensor_per_dtype():
    outputs = {
        "loss": torch.tensor(1.5),
        "actions": torch.arange(6).reshape(3, 2),  # int64 between float32 outputs
        "logprobs": torch.tensor([0.25, -1.0, 2.0]),
        "matrix": torch.arange(4.0).reshape(2, 2).t(),  # not contiguous
    }
    layout = PackedOutputs(outputs)
    packed = layout.pack(outputs)
    assert [flat.dtype for flat in packed] == [torch.float32, torch.int64]
    assert [flat.shape for flat in packed] == [(1 + 3 + 4,), (6,)]

    copies = [flat.clone() for flat in packed]
    unpacked = layout.unpack(copies)
    assert list(unpacked) == list(outputs)
    for name, output in outputs.items():
        assert unpacked[name].dtype == output.dtype and torch.equal(unpacked[name], output)
    storages = {value.untyped_storage().data_ptr() for value in unpacked.values()}
    assert storages == {copy.untyped_storage().data_ptr() for copy in copies}


def test_a_single_contiguous_output_is_packed_without_a_copy():
    actions = torch.randn(8, 3)
    (packed,) = PackedOutputs({"0": actions}).pack({"0": actions})
    assert packed.data_ptr() == actions.data_ptr()


def _average_deferred_then_run(rank: int, port: int, folder: str) -> None:
    join_as_rank(rank, port)
    runtime = TorchRuntime(SACConfig(), 2)
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    gradients = FlatGradients(list(model.parameters())).buffer
    deferred: list = []
    with runtime.collectives_deferred(deferred.append):
        runtime.backward_and_average(model(torch.full((1, 3), float(rank + 1))).sum(), [gradients])
    own = gradients.tolist()  # the collective has not run: this rank's own gradient
    for collective in deferred:
        collective()
    Path(folder, f"rank{rank}.json").write_text(json.dumps([len(deferred), own, gradients.tolist()]))
    runtime.shutdown()


def test_a_captured_step_among_learners_hands_its_gradient_average_over_to_run_between_graphs(tmp_path):
    """The seam a step captured among several learners is cut at: the average is handed over, not run,
    and the handed-over call averages as the eager step does."""
    mp.spawn(_average_deferred_then_run, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        handed_over, own, averaged = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert handed_over == 1
        assert own == [float(rank + 1)] * 3  # d(w . x)/dw = x, this rank's own input
        assert averaged == [1.5] * 3  # the mean of the two ranks' gradients
