"""Imports only point down: the version-free layers never import SGLang, torch or a layer above."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sglang_prefill_ext"


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Module -> the absolute names it imports (relative imports resolved), for every file under `folder`."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = module.rsplit(".", node.level)[0] if node.level else ""
                names.add(".".join(p for p in (base, node.module) if p))
        found[module] = names
    return found


@pytest.mark.parametrize(
    ("layer", "allowed", "foreign"),
    [
        ("radix", ("sglang_prefill_ext.radix",), {"sglang", "torch"}),
        ("runner", ("sglang_prefill_ext.runner", "sglang_prefill_ext.radix"), {"sglang", "torch"}),
        ("ops", ("sglang_prefill_ext.ops",), {"sglang"}),
        ("blend", ("sglang_prefill_ext.blend", "sglang_prefill_ext.ops"), {"sglang", "transformers"}),
        (
            "doctor",
            ("sglang_prefill_ext.doctor", "sglang_prefill_ext.runner.pass_cost"),
            {"sglang", "torch"},
        ),
    ],
)
def test_layer_imports_nothing_above_it(layer: str, allowed: tuple[str, ...], foreign: set[str]) -> None:
    for module, names in imported_modules(PACKAGE / layer).items():
        ours = {n for n in names if n.startswith("sglang_prefill_ext")}
        above = sorted(n for n in ours if not n.startswith(allowed))
        assert not above, f"{module} imports {above}"
        assert not {n.split(".")[0] for n in names} & foreign, f"{module} imports {names}"


def test_only_the_adapters_and_the_harness_import_sglang() -> None:
    """The harness (the tests' and CPU replays' SGLang objects) sits on the adapters; nothing else
    in the package imports it."""
    for module, names in imported_modules(PACKAGE).items():
        layer = module.split(".")[1]
        if layer not in ("adapters", "harness"):
            assert "sglang" not in {n.split(".")[0] for n in names}, f"{module} imports {names}"
        if layer != "harness":
            assert not any(n.startswith("sglang_prefill_ext.harness") for n in names), (
                f"{module} imports the harness"
            )


def test_config_loads_without_torch() -> None:
    """SGLang's server-args module imports the options; their sparse defaults come from
    `ops.settings`, which must not pull torch in with it."""
    probe = "import sys, sglang_prefill_ext.config; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
