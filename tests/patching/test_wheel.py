"""docs/PATCHING.md's walk-through for one's own SGLang, with the package built as a wheel and installed
non-editable (into a folder of its own, offline), applied to a pristine copy of the real SGLang."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.patching.test_patch_set import tree_hashes

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"{argv}: {result.stdout}{result.stderr}"
    return result


def test_wheel_installed_non_editable_patches_sglang(
    tmp_path: Path, sglang_copy: Path, sglang_version: str
) -> None:
    # `pip install .` from a source tree holding only what a checkout ships for the package.
    source = tmp_path / "source"
    for folder in ("sglang_prefill_ext", "patches"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        source,
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("sglang_prefill_ext-*.whl")
    site = tmp_path / "installed"
    run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--target",
        site,
        wheel,
        env=env,
        cwd=tmp_path,
    )
    shutil.rmtree(source)  # nothing may be found in the source tree

    # The installed package, then the pristine SGLang copy, ahead of the venv's editable checkout.
    env["PYTHONPATH"] = f"{sglang_copy}{os.pathsep}{site}"
    found = run(
        sys.executable, "-c", "import sglang_prefill_ext as p; print(p.__file__)", env=env, cwd=tmp_path
    )
    assert found.stdout.startswith(str(site))
    before = tree_hashes(sglang_copy)
    console = site / "bin" / "sglang-prefill-ext"

    applied = run(sys.executable, console, "apply", env=env, cwd=tmp_path)
    assert "apply: changed" in applied.stdout and str(sglang_copy) in applied.stdout
    status = run(sys.executable, console, "status", env=env, cwd=tmp_path)
    assert status.stdout.strip() == f"SGLang {sglang_version} in {sglang_copy}: applied"
    help_text = run(sys.executable, "-m", "sglang.launch_server", "--help", env=env, cwd=tmp_path).stdout
    assert "--enable-prefill-ext" in help_text and "--prefill-ext-eviction" in help_text
    run(sys.executable, console, "revert", env=env, cwd=tmp_path)
    assert tree_hashes(sglang_copy) == before
