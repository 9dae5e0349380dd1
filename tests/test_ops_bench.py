"""bench.ops.ops_bench's report on the CPU: the select's kernel breakdown reaches the table."""

from __future__ import annotations

from bench.ops import ops_bench


def test_table_lists_the_selects_kernels_largest_first() -> None:
    row = dict(L=8192, path="chunk8K_antidiagonal_plan_once", backend="fa3", ms=2.0, select_gpu_ms=0.75)
    row["select_kernels"] = {"_packed_lse_kernel": 0.5, "_tile_mass_kernel": 0.25}
    text = ops_bench.table([row], 500.0)
    line = next(x for x in text.splitlines() if x.startswith("select's kernels"))
    assert line == (
        "select's kernels, chunk8K_antidiagonal_plan_once (fa3): _packed_lse_kernel 0.5 ms, _tile_mass_kernel 0.25 ms"
    )
    assert "0.75" in text.splitlines()[2]
