"""A graph's device is its tensors', not a CPU scalar's beside them: 0-d CPU tensors, which
eager's GPU ops take as scalars, are listed to be copied to the graph's device ("meta"
stands in for a GPU)."""

import torch

from kiln.frontend.importer import cpu_scalars, graph_device


def test_a_cpu_scalar_beside_a_gpu_tensor_leaves_the_graph_on_the_gpu():
    scalar, gpu = torch.tensor(1e-6, dtype=torch.float64), torch.empty(4, 8, device="meta")
    inputs = [3, scalar, gpu, scalar]
    assert graph_device(inputs) == torch.device("meta")
    assert cpu_scalars(inputs) == [1, 3]


def test_cpu_graphs_copy_nothing():
    inputs = [torch.tensor(2.0), torch.randn(3)]
    assert graph_device(inputs) == torch.device("cpu") and cpu_scalars(inputs) == []
    assert graph_device([torch.tensor(2.0)]) == graph_device([1]) == torch.device("cpu")
    # a CPU tensor of one or more dims beside a GPU's is no scalar: the graph is on two devices
    assert cpu_scalars([torch.randn(3), torch.empty(2, device="meta")]) == []


def test_cpu_scalars_reach_the_program_as_aligned_scalars_of_their_values():
    from kiln.frontend.backend import _ScalarsToDevice

    received = []
    program = _ScalarsToDevice(lambda args: received.extend(args), [1, 2, 4], torch.device("cpu"))
    x, y = torch.randn(3), torch.randn(2)
    f64 = torch.float64
    scalars = [torch.tensor(1.5, dtype=f64), torch.tensor(-7), torch.tensor(2.25, dtype=f64)]
    program([x, scalars[0], scalars[1], y, scalars[2]])
    assert received[0] is x and received[3] is y
    for got, want in zip([received[1], received[2], received[4]], scalars):
        assert got.dim() == 0 and got.dtype == want.dtype and got.item() == want.item()
        assert got.data_ptr() % 16 == 0
