"""bench/'s groups share code only through bench.lib, which imports no group."""

from __future__ import annotations

from pathlib import Path

from tests.test_layers import imported_modules

BENCH = Path(__file__).resolve().parents[1] / "bench"
GROUPS = ("serving", "replay", "ops", "accuracy")


def test_groups_import_their_own_group_and_lib_only() -> None:
    for group in (*GROUPS, "lib"):
        allowed = ("bench.lib", f"bench.{group}")
        modules = imported_modules(BENCH / group)
        assert modules, group
        for module, names in modules.items():
            foreign = sorted(n for n in names if n.startswith("bench") and not n.startswith(allowed))
            assert not foreign, f"{module} imports {foreign}"
