"""Generated Triton kernels compile for sm_90 in worker processes, and this process loads
them from Triton's cache; a failed or dead worker only costs a compile here."""

import logging
import os
import pickle

import pytest
from generated_kernels import kernels_pickle
from triton import knobs

from kiln.codegen import triton as tr
from kiln.runtime import compile_pool, triton_build
from kiln.runtime.triton_build import (
    _load,
    _resources,
    compile_for_target,
    compile_variants,
    interpreted,
    programs_per_sm,
    register_caps,
)

pytestmark = pytest.mark.skipif(interpreted(), reason="compiles for a GPU, not for Triton's interpreter")

SM90 = ("cuda", 90, 32)


@pytest.fixture(scope="session")
def generated_kernels(tmp_path_factory) -> str:
    return kernels_pickle(tmp_path_factory)


@pytest.fixture(scope="module")
def kernels(generated_kernels):
    """(kernel, generated source path) pairs; the pool is stopped after the module."""
    with open(generated_kernels, "rb") as f:
        loaded = [(k, _load(k, tr.render_source(k))[1]) for k in pickle.load(f)]
    yield loaded
    compile_pool.shutdown_pool()


@pytest.fixture
def cache_hits(monkeypatch, tmp_path):
    """Whether each triton.compile in this process found its result in a fresh cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    hits = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: hits.append(kw["cache_hit"]))
    return hits


@pytest.fixture(autouse=True)
def one_compile_a_kernel(request, monkeypatch):
    """No second compile under a register cap (tested on its own below)."""
    if "register" not in request.node.name:
        monkeypatch.setattr(triton_build, "register_caps", lambda registers, warps: [])


@pytest.fixture
def pool_for_three(monkeypatch):
    """Send batches of three compiles to the workers (the default waits for more)."""
    monkeypatch.setattr(compile_pool, "MIN_POOL_JOBS", 3)


def _raise_in_worker(args, cache_dir, settings):
    raise RuntimeError("worker failure for the test")


def _exit_in_worker(args, cache_dir, settings):
    os._exit(3)


def test_few_compiles_do_not_start_workers(kernels, cache_hits):
    compile_pool.shutdown_pool()
    compile_variants(kernels[:3], SM90)
    assert compile_pool._pool is None and cache_hits == [False] * 3


def test_workers_compile_and_this_process_loads_from_cache(kernels, cache_hits, monkeypatch, tmp_path,
                                                          pool_for_three):
    variants = compile_variants(kernels, SM90)
    assert len(cache_hits) == len(kernels) >= compile_pool.MIN_POOL_JOBS
    assert all(cache_hits)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "direct"))
    kernel, _ = kernels[-1]
    direct = compile_for_target(kernel, tr.render_source(kernel))
    (pooled,) = variants[-1].values()
    assert direct.hash == pooled.hash and direct.asm["cubin"] == pooled.asm["cubin"]


def test_a_failed_worker_compile_falls_back_to_this_process(kernels, cache_hits, monkeypatch, caplog,
                                                           pool_for_three):
    monkeypatch.setattr(compile_pool, "_compile_in_worker", _raise_in_worker)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        variants = compile_variants(kernels[:3], SM90)
    assert all(v.asm["cubin"] for vs in variants for v in vs.values())
    assert caplog.text.count("worker failure for the test") == 3
    assert cache_hits == [False] * 3


def test_compiles_survive_workers_that_die(kernels, cache_hits, monkeypatch, caplog, pool_for_three):
    with monkeypatch.context() as m, caplog.at_level(logging.WARNING, logger="kiln"):
        m.setattr(compile_pool, "_compile_in_worker", _exit_in_worker)
        variants = compile_variants(kernels[:3], SM90)
    assert all(v.asm["cubin"] for vs in variants for v in vs.values())
    assert "workers stopped" in caplog.text and compile_pool._pool is None
    compile_variants(kernels[3:6], SM90)
    assert cache_hits == [False] * 3 + [True] * 3


def test_workers_compile_with_settings_made_after_they_started(kernels, cache_hits, monkeypatch,
                                                            pool_for_three):
    """Another library (Inductor) may change Triton's settings once the workers run: they
    compile with this process's settings, so this process still finds their results."""
    compile_variants(kernels[:3], SM90)  # the workers start
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")  # part of every compile's cache hash
    cache_hits.clear()
    compile_variants(kernels[3:6], SM90)
    assert cache_hits == [True] * 3


def test_workers_hash_the_ptxas_named_after_this_process_first_compiled(kernels, cache_hits, monkeypatch,
                                                                        tmp_path, pool_for_three):
    """Inductor names PyTorch's ptxas when it first compiles. ptxas's version is part of every
    compile's cache hash, and Triton keeps the version of the first ptxas it ran: this
    process hashes the ptxas the workers run, so it still finds their results."""
    from triton.backends.nvidia.compiler import get_ptxas_version

    compile_variants(kernels[:3], SM90)
    wrapper = tmp_path / "ptxas"  # the same compiler, another --version text
    wrapper.write_text(f'#!/bin/sh\n"{knobs.nvidia.ptxas.path}" "$@" || exit $?\n'
                       '[ "$1" = --version ] && echo "another build"\nexit 0\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(wrapper))
    cache_hits.clear()
    try:
        compile_variants(kernels[3:6], SM90)
        assert "another build" in get_ptxas_version(90)
    finally:
        get_ptxas_version.cache_clear()
    assert cache_hits == [True] * 3


def test_register_budgets():
    # 8 registers a thread per allocation unit: 74 take as many as 80 (6 programs of 4 warps
    # on an SM), 72 fit 7; 28 and 32 both fit the 16 programs of 4 warps the threads allow,
    # but kernels of fewer than 32 registers are not raised
    assert programs_per_sm(74, 4) == 6 and programs_per_sm(72, 4) == 7
    assert programs_per_sm(40, 1) == 32  # at most 32 programs, however small
    assert register_caps(74, 4) == [72, 80] and register_caps(72, 4) == [] and register_caps(30, 4) == []
    # 42 fit 10 programs and 40 would fit 12; failing that (a spill), up to 48 still fit 10
    assert register_caps(42, 4) == [40, 48] and programs_per_sm(48, 4) == 10 < programs_per_sm(40, 4)
    assert register_caps(250, 1) == [] and max(register_caps(200, 4)) <= 255
    # fewer registers than one allocation unit: nothing lower to try
    assert register_caps(5, 4) == [] and programs_per_sm(0, 4) == programs_per_sm(8, 4) == 16


def test_launches_that_do_not_fill_the_gpu_compile_once(kernels, cache_hits, monkeypatch):
    """A launch of no more programs than the GPU has multiprocessors runs one on each,
    whatever its registers: no budget can speed it, so its kernel compiles once."""
    budgets = []
    monkeypatch.setattr(triton_build, "register_caps", lambda regs, warps: budgets.append(regs) or [])
    monkeypatch.setattr(triton_build, "MULTIPROCESSORS", 1 << 30)
    compile_variants(kernels, SM90)
    assert budgets == []
    monkeypatch.setattr(triton_build, "MULTIPROCESSORS", 0)
    compile_variants(kernels, SM90)
    assert len(budgets) == len(kernels)


def test_kernels_compile_under_their_register_budget(kernels, cache_hits, monkeypatch):
    monkeypatch.setattr(triton_build, "MULTIPROCESSORS", 0)  # every launch fills the GPU
    # with fp fusion (off in kiln's builds, for eager's rounding) one canonical kernel fits
    # another program under a budget without spilling: the budgets' mechanism is what is tested
    options = triton_build._options
    monkeypatch.setattr(triton_build, "_options", lambda warps: {**options(warps), "enable_fp_fusion": True})
    uncapped = []  # (registers, warps) of each first compile, in the jobs' order

    def recording(registers, warps):
        uncapped.append((registers, warps))
        return register_caps(registers, warps)

    monkeypatch.setattr(triton_build, "register_caps", recording)
    variants = compile_variants(kernels, SM90)
    capped = [c for vs in variants for c in vs.values() if c.metadata.maxnreg]
    assert capped, "no generated kernel compiled under a register budget"
    for c in capped:
        registers, warps = _resources(c)[0], c.metadata.num_warps
        assert registers <= c.metadata.maxnreg
        assert programs_per_sm(registers, warps) > programs_per_sm(c.metadata.maxnreg + 1, warps)
    binaries = [c for vs in variants for c in vs.values()]
    assert len(uncapped) == len(binaries)
    for (first, warps), c in zip(uncapped, binaries):
        assert programs_per_sm(_resources(c)[0], warps) >= programs_per_sm(first, warps)  # never fewer
