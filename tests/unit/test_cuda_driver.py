"""Launching a stored binary through the CUDA driver, against a stand-in driver library
built here (no GPU): the parameter block holds the tensors' addresses then Triton's two
scratch pointers, and the grid, program size, shared memory and stream are the binary's."""

from __future__ import annotations

import ctypes

import pytest
import stand_in_cuda
import torch

from kiln.runtime import cuda_driver
from kiln.runtime.triton_abi import KernelBinary


@pytest.fixture
def stand_in_driver(tmp_path, monkeypatch):
    library = stand_in_cuda.build(tmp_path)
    if library is None:
        pytest.skip("needs a C compiler to build the stand-in driver")
    monkeypatch.setattr(cuda_driver, "LIBRARY", str(library))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0x5000, raising=False)
    cuda_driver._driver.cache_clear()
    cuda_driver._primary_context.cache_clear()
    yield ctypes.CDLL(str(library))
    cuda_driver._driver.cache_clear()
    cuda_driver._primary_context.cache_clear()


def _binary(arch: int = 90) -> KernelBinary:
    signature = {
        "in0": "*fp32",
        "in1": "*bf16",
        "out0": "*fp32",
        "XBLOCK": "constexpr",
        "RBLOCK": "constexpr",
    }
    return KernelBinary(
        "kiln_add_0", b"\x7fELF and the rest", arch, 32, 4, 1, 512, 0, 1, 0, 1, signature,
        {"XBLOCK": 1024, "RBLOCK": 1}, (1024, 1, 4), (7, 3, 1), True,
    )  # fmt: skip


def test_a_launch_passes_the_tensors_then_the_scratch_pointers(stand_in_driver):
    lib = stand_in_driver
    b = _binary()
    launch = cuda_driver.BinaryLaunch(b, 0)
    assert ctypes.string_at(lib.seen_image, 4) == b"\x7fELF"
    assert ctypes.string_at(lib.seen_name) == b"kiln_add_0"
    ctypes.c_int.in_dll(lib, "param_count").value = b.pointers + 2
    tensors = [torch.randn(8), torch.randn(8).bfloat16(), torch.empty(8)]
    for _ in range(2):  # the parameter block is reused: a second launch writes new addresses
        tensors = [t.clone() for t in tensors]
        launch(*tensors)
        params = list((ctypes.c_uint64 * 5).in_dll(lib, "seen_params"))
        assert params == [t.data_ptr() for t in tensors] + [0, 0]
    assert list((ctypes.c_uint * 7).in_dll(lib, "seen_dims")) == [7, 3, 1, 128, 1, 1, 512]
    assert ctypes.c_void_p.in_dll(lib, "seen_stream").value == 0x5000
    assert ctypes.c_void_p.in_dll(lib, "seen_function").value == 0x3000
    assert ctypes.c_int.in_dll(lib, "launches").value == 2


def test_a_failed_launch_names_the_kernel_and_the_error(stand_in_driver):
    launch = cuda_driver.BinaryLaunch(_binary(), 0)
    ctypes.c_int.in_dll(stand_in_driver, "fail_with").value = 700
    with pytest.raises(RuntimeError, match="launching kiln_add_0 failed: CUDA_ERROR_STAND_IN \\(700\\)"):
        launch(torch.empty(1), torch.empty(1), torch.empty(1))


def test_a_thread_without_a_current_context_is_given_the_primary_one(stand_in_driver):
    lib = stand_in_driver
    launch = cuda_driver.BinaryLaunch(_binary(), 0)
    sets = ctypes.c_int.in_dll(lib, "context_sets").value
    ctypes.c_int.in_dll(lib, "fail_once_with").value = 201  # CUDA_ERROR_INVALID_CONTEXT
    launch(torch.empty(1), torch.empty(1), torch.empty(1))
    assert ctypes.c_int.in_dll(lib, "launches").value == 2  # refused, then launched
    assert ctypes.c_int.in_dll(lib, "context_sets").value == sets + 1


def test_a_binary_for_another_architecture_is_not_loaded(stand_in_driver):
    with pytest.raises(RuntimeError, match="compiled for sm_80; GPU 0 is sm_90"):
        cuda_driver.BinaryLaunch(_binary(arch=80), 0)


def test_without_a_gpu_the_driver_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cuda_driver._driver.cache_clear()
    with pytest.raises(cuda_driver.CudaUnavailable, match="no CUDA GPU"):
        cuda_driver.BinaryLaunch(_binary(), 0)


def test_a_tensor_off_16_bytes_goes_to_the_binary_for_any_address(stand_in_driver, tmp_path):
    import dataclasses

    lib = stand_in_driver
    aligned = _binary()
    anywhere = dataclasses.replace(aligned, name="kiln_add_0_any_address", aligned=False)
    launcher = cuda_driver.BinaryLauncher(
        "kiln_add_0", {aligned.config: aligned}, tmp_path / "t.json", anywhere, device=0
    )
    x = torch.randn(9)
    launcher(x[:8], x[:8], x[:8])
    assert ctypes.string_at(lib.seen_name) == b"kiln_add_0"
    launcher(x[1:], x[:8], x[:8])  # 4 bytes past an aligned start
    assert ctypes.string_at(lib.seen_name) == b"kiln_add_0_any_address"
    assert ctypes.c_int.in_dll(lib, "launches").value == 2

    only_aligned = cuda_driver.BinaryLauncher(
        "kiln_add_0", {aligned.config: aligned}, tmp_path / "t.json", device=0
    )
    with pytest.raises(RuntimeError, match="compiled for tensors on 16-byte boundaries"):
        only_aligned(x[1:], x[:8], x[:8])


def test_a_launcher_of_its_own_is_no_stored_binary_and_takes_any_address(tmp_path):
    """max-autotune's cuBLAS candidate sits among a template's variants: storing binaries gives
    a reason instead of failing, and once chosen it runs whatever the tensors' alignment."""
    import torch

    from kiln.runtime.autotune import TunedLauncher
    from kiln.runtime.triton_build import binaries_of

    ran = []
    variants = {("cublas",): lambda *tensors: ran.append(len(tensors))}
    assert "not a Triton binary" in binaries_of(variants, lambda config: (1, 1, 1), "kiln_mm_0")
    launcher = TunedLauncher("kiln_mm_0", lambda config: (1, 1, 1), None, variants, tmp_path / "t.json", 2)
    off_boundary = torch.empty(9)[1:]
    launcher(off_boundary, off_boundary)
    assert ran == [2]
