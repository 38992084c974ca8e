"""Triton kernel templates: hand-tiled kernels (a matmul) into which kiln renders the
element-wise work of a kernel IR epilogue, through the same renderer as every kernel."""
