"""A stand-in for the CUDA driver library (libcuda), built with the system C compiler: it
records what cuLaunchKernel receives, so launches can be checked on a machine without a GPU
(a plain module shared by the tests that use it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

FAKE_DRIVER = r"""
#include <stdint.h>
#include <string.h>
typedef int CUresult;
int param_count = 0, launches = 0, fail_with = 0, fail_once_with = 0, context_sets = 0;
uint64_t seen_params[32];
unsigned seen_dims[7];
void *seen_stream, *seen_function;
char seen_name[128], seen_image[4];
CUresult cuGetErrorName(CUresult r, const char **s) { *s = "CUDA_ERROR_STAND_IN"; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) { *v = 232448; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)0x1000; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = (void *)0x1000; return 0; }
CUresult cuCtxSetCurrent(void *c) { context_sets++; return 0; }
CUresult cuModuleLoadData(void **m, const void *image) {
  memcpy(seen_image, image, 4); *m = (void *)0x2000; return 0;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  strncpy(seen_name, name, 127); *f = (void *)0x3000; return 0;
}
CUresult cuFuncGetAttribute(int *v, int attribute, void *f) { *v = attribute == 0 ? 1024 : 0; return 0; }
CUresult cuFuncSetAttribute(void *f, int attribute, int v) { return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
  memcpy(seen_dims, dims, sizeof dims);
  seen_function = f; seen_stream = stream;
  for (int i = 0; i < param_count; i++) seen_params[i] = *(uint64_t *)params[i];
  launches++;
  if (fail_once_with) {
    int result = fail_once_with;
    fail_once_with = 0;
    return result;
  }
  return fail_with;
}
"""


def build(folder: Path) -> Path | None:
    """The stand-in library built in folder; None without a C compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    (folder / "driver.c").write_text(FAKE_DRIVER)
    library = folder / "libcuda_stand_in.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(folder / "driver.c")], check=True)
    return library


# Lines that make this process look like one with an sm_90 GPU whose driver is the stand-in.
FAKE_GPU = """
import torch
from kiln.runtime import cuda_driver
cuda_driver.LIBRARY = {library!r}
torch.cuda.is_available = lambda: True
torch.cuda.init = lambda: None
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda device=None: (9, 0)
torch.cuda.get_device_name = lambda device=None: "stand-in"
torch._C._cuda_getCurrentRawStream = lambda device: 0x5000
"""
