"""The model code an FX node came from (frontend/origin.py), as each torch version marks it."""

import torch

from kiln.frontend.origin import origin_of

STACK = {"L__self___norm": ("L['self'].norm", torch.nn.LayerNorm)}
TRACE = 'File "/m/model.py", line 12, in forward\n    y = self.norm(x)'


def test_a_backward_node_is_named_as_the_gradient_of_its_forward_code():
    # torch 2.13 marks a backward node with autograd_backward; 2.11 with the partitioner's tag only
    for mark in ({"autograd_backward": True}, {"partitioner_tag": "is_backward"}):
        origin = origin_of({"fwd_nn_module_stack": STACK, "stack_trace": TRACE, **mark})
        assert origin.backward and origin.module == "norm" and origin.line == 12, (mark, origin)
        assert origin.text().startswith("grad of ")


def test_a_forward_node_recomputed_in_the_backward_keeps_its_own_code():
    origin = origin_of({"nn_module_stack": STACK, "stack_trace": TRACE, "partitioner_tag": "is_backward"})
    assert not origin.backward and origin.module == "norm"
    origin = origin_of({"partitioner_tag": "is_forward", "fwd_nn_module_stack": STACK})
    assert not origin.backward
