"""The kernels' CUDA sources compile for the H200 (sm_90), where ``nvcc`` is installed (a CUDA toolkit without a
GPU): a source that does not compile would cost a GPU session its kernels (each is a recorded fallback there).

Each source is wrapped as ``mx.fast.cuda_kernel`` wraps it (MLX's ``custom_kernel.cpp``, ``build_kernel``): the
header, then a ``__global__`` function taking each input (with ``<name>_shape`` / ``_strides`` / ``_ndim`` where
the source names them) and each output, the template arguments as ``constexpr`` constants, and the source as
its body. MLX's own device header is replaced by what the sources use from it.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from specbench.kernels import attention, gemv, qmv

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found: the sources are compiled on the CUDA device")

#: What the sources take from MLX's default header (``mlx/backend/cuda/device/utils.cuh``, ``inf``).
MLX_TYPES = r"""
#include <cooperative_groups.h>
#include <cstdint>
struct Shape { int32_t d[8]; __device__ int32_t operator[](int i) const { return d[i]; } };
struct Strides { int64_t d[8]; __device__ int64_t operator[](int i) const { return d[i]; } };
#include <cuda/std/limits>
#define inf cuda::std::numeric_limits<float>::infinity()
template <typename U> struct Limits {
  static __device__ U max() { return cuda::std::numeric_limits<U>::infinity(); }
  static __device__ U min() { return -cuda::std::numeric_limits<U>::infinity(); }
  static __device__ U finite_max() { return cuda::std::numeric_limits<U>::max(); }
  static __device__ U finite_min() { return cuda::std::numeric_limits<U>::lowest(); }
};
"""
CUDA_TYPES = {"bf16": "__nv_bfloat16", "fp16": "__half", "f32": "float", "u32": "uint32_t", "i32": "int32_t"}


def wrapped(name: str, source: str, inputs: dict[str, str], outputs: dict[str, str], template: dict) -> str:
    """``source`` as the body of the ``__global__`` function ``name`` that MLX builds around it."""
    params = []
    for arg, dtype in inputs.items():
        params.append(f"const {CUDA_TYPES[dtype]}* {arg}")
        for suffix, kind in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
            if arg + suffix in source:
                params.append(f"const __grid_constant__ {kind} {arg}{suffix}")
    params += [f"{CUDA_TYPES[dtype]}* {arg}" for arg, dtype in outputs.items()]
    constants = []
    for constant, value in template.items():
        if isinstance(value, bool):
            constants.append(f"  constexpr bool {constant} = {str(value).lower()};")
        elif isinstance(value, int):
            constants.append(f"  constexpr int {constant} = {value};")
        else:
            constants.append(f"  using {constant} = {CUDA_TYPES[value]};")
    return f"__global__ void {name}({', '.join(params)}) {{\n" + "\n".join(constants) + f"\n{source}\n}}\n"


def compile_units(tmp_path, header: str, kernels: list[str]) -> str:
    """Compile the kernels (one translation unit) for sm_90; the assembler's report (registers, spills)."""
    unit = MLX_TYPES + header + "namespace mlx::core::cu {\nnamespace cg = cooperative_groups;\n"
    unit += "".join(kernels) + "}\n"
    path = tmp_path / "kernels.cu"
    path.write_text(unit)
    done = subprocess.run(
        [NVCC, "-arch=sm_90", "-std=c++17", "-cubin", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def test_qmv_rows_compiles_in_every_schedule(tmp_path):
    cases = [
        ("bf16", 4, 64, 9, True, 0, 0),
        ("bf16", 4, 64, 9, True, 0, 1),
        ("bf16", 4, 32, 1, False, 2, 1),
        ("fp16", 8, 128, 16, True, 1, 1),
        ("fp16", 8, 64, 16, False, 0, 0),
    ]
    kernels = []
    for i, (dtype, bits, group, rows, residue, mode, schedule) in enumerate(cases):
        template = {"T": dtype, "BITS": bits, "GROUP": group, "ROWS": rows, "RESIDUE": residue, "MODE": mode}
        template["SCHEDULE"] = schedule
        inputs = {"x": dtype, "w": "u32", "scales": dtype, "biases": dtype}
        kernels.append(wrapped(f"qmv_{i}", qmv._SOURCE, inputs, {"out": dtype}, template))
    report = compile_units(tmp_path, qmv._HEADER, kernels)
    assert report.count("Used ") == len(cases)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills == [0] * len(cases), report  # every row count's sums stay in registers


def test_gemv_and_attention_rows_compile(tmp_path):
    gemv_kernel = wrapped(
        "gemv",
        gemv._SOURCE,
        {"x": "bf16", "w": "bf16"},
        {"out": "bf16"},
        {"T": "bf16", "ROWS": 9, "NPT": 4, "MODE": 0},
    )
    scan = wrapped(
        "scan",
        attention._SCAN,
        {"queries": "bf16", "keys": "bf16", "values": "bf16", "scale": "f32", "starts": "i32"},
        {"partials": "f32", "maxs": "f32", "sums": "f32"},
        {"T": "bf16", "D": 128, "TWO_PASS": True, "CAUSAL": True, "QV": 4, "VARIANT": 0},
    )
    merge = wrapped(
        "merge",
        attention._MERGE,
        {"partials": "f32", "maxs": "f32", "sums": "f32"},
        {"out": "bf16"},
        {"T": "bf16", "D": 128},
    )
    report = compile_units(tmp_path, gemv._HEADER + attention._HEADER, [gemv_kernel, scan, merge])
    assert report.count("Used ") == 3
