"""What a captured step does that a CPU can check: its outputs' packing."""

import torch

from rl.cuda_graphs import PackedOutputs


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
