"""The kernels' launch in row blocks (``specbench.kernels.jit.launch_in_row_blocks``), with a stand-in kernel that
computes the product the real ones compute: the rows split in launches of at most ``max_rows``, each told its row
count, the result in the input's shape and dtype."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specbench.kernels.jit import launch_in_row_blocks


@pytest.mark.parametrize("shape", [(20, 64), (1, 20, 64), (2, 3, 64), (16, 64)])
def test_rows_are_launched_in_blocks_and_the_result_keeps_the_inputs_shape(shape):
    launches = []

    def kernel(inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        rows, weight = inputs
        launches.append((dict(template), rows.shape, grid, threadgroup, output_shapes))
        return [(rows @ weight.T).astype(output_dtypes[0])]

    mx.random.seed(0)
    x = mx.random.normal(shape).astype(mx.bfloat16)
    weight = mx.random.normal((24, 64)).astype(mx.bfloat16)
    out = launch_in_row_blocks(kernel, x, 24, [weight], [("T", mx.bfloat16)], (32, 8, 1), (32, 8, 1), max_rows=16)
    rows = int(np.prod(shape[:-1]))
    assert [launch[0]["ROWS"] for launch in launches] == [min(16, rows - s) for s in range(0, rows, 16)]
    assert all(launch[1] == (launch[0]["ROWS"], 64) and launch[4] == [(launch[0]["ROWS"], 24)] for launch in launches)
    assert all(launch[0]["T"] == mx.bfloat16 and launch[2] == (32, 8, 1) for launch in launches)
    assert out.shape == (*shape[:-1], 24) and out.dtype == mx.bfloat16
    assert mx.array_equal(out, (x @ weight.T).astype(mx.bfloat16))
