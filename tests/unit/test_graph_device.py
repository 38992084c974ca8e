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
