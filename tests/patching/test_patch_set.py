"""apply / revert / check / status on a private copy of the real installed SGLang."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_prefill_ext.patching import PatchError, PatchSet, supported_versions, unidiff

REPO = Path(__file__).resolve().parents[2]


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_prefill_ext.cli", *args], capture_output=True, text=True, check=False
    )


def test_round_trip_is_byte_identical(sglang_copy: Path, sglang_version: str) -> None:
    before = tree_hashes(sglang_copy)
    patches = PatchSet(sglang_version, sglang_copy)
    assert patches.status() == "not applied"
    changed = patches.apply()
    assert changed and patches.status() == "applied"
    assert tree_hashes(sglang_copy) != before
    after_one = tree_hashes(sglang_copy)
    assert patches.apply() == []
    assert tree_hashes(sglang_copy) == after_one
    assert sorted(patches.revert()) == sorted(changed)
    assert tree_hashes(sglang_copy) == before
    assert patches.revert() == []


def test_script_round_trip_and_messages(sglang_copy: Path, sglang_version: str) -> None:
    before = tree_hashes(sglang_copy)
    env = {"SGLANG_VERSION": sglang_version, "SGLANG_DIR": str(sglang_copy), "PYTHON": sys.executable}
    script = str(REPO / "scripts" / "apply_patch.sh")

    def run(verb: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", script, verb], env=env, capture_output=True, text=True, check=False)

    assert "not applied" in run("status").stdout
    assert "apply would change" in run("check").stdout
    assert tree_hashes(sglang_copy) == before, "check must not write"
    assert run("apply").returncode == 0
    second = run("apply")
    assert second.returncode == 0 and "already applied" in second.stdout
    assert ": applied" in run("status").stdout
    assert run("revert").returncode == 0
    assert tree_hashes(sglang_copy) == before


def test_unknown_version_refused_touching_nothing(sglang_copy: Path) -> None:
    before = tree_hashes(sglang_copy)
    result = cli("apply", "--sglang-version", "0.4.0", "--sglang-dir", str(sglang_copy))
    assert result.returncode != 0
    assert "no patches for SGLang 0.4.0" in result.stderr
    for version in supported_versions():
        assert version in result.stderr
    assert tree_hashes(sglang_copy) == before


def test_installed_version_mismatch_refused(sglang_copy: Path, sglang_version: str, tmp_path: Path) -> None:
    version_file = sglang_copy / "sglang" / "_version.py"
    version_file.write_text(version_file.read_text().replace(f"'{sglang_version}'", "'0.5.16'"))
    before = tree_hashes(sglang_copy)
    with pytest.raises(PatchError, match=f"is 0.5.16, not {sglang_version}"):
        PatchSet(sglang_version, sglang_copy)
    assert tree_hashes(sglang_copy) == before


def test_not_an_sglang_folder_refused(tmp_path: Path, sglang_version: str) -> None:
    with pytest.raises(PatchError, match="not an SGLang install"):
        PatchSet(sglang_version, tmp_path)


def test_hand_modified_target_refused_without_partial_writes(sglang_copy: Path, sglang_version: str) -> None:
    patches = PatchSet(sglang_version, sglang_copy)
    first, *rest = patches.targets
    assert rest, "the refusal must be shown with more than one target file"
    text = first.path.read_text()
    anchor = first.diff.hunks[0].old_lines[-1]
    first.path.write_text(text.replace(anchor, anchor.rstrip("\n") + "  # edited by hand\n", 1))
    before = tree_hashes(sglang_copy)
    assert "foreign changes" in patches.status()
    for verb in (patches.apply, patches.revert, patches.check):
        with pytest.raises(PatchError, match=str(first.path)):
            verb()
    assert tree_hashes(sglang_copy) == before


def test_partial_apply_is_completed(sglang_copy: Path, sglang_version: str) -> None:
    """A tree left half-patched (say, a crash between renames) is reported and finished by apply."""
    before = tree_hashes(sglang_copy)
    patches = PatchSet(sglang_version, sglang_copy)
    patches.apply()
    patched = tree_hashes(sglang_copy)
    original = patches.targets[-1]
    original.path.write_text(unidiff.apply(original.diff.reversed(), original.read()))
    assert patches.status().startswith("partially applied")
    assert patches.apply() == [str(original.path)]
    assert tree_hashes(sglang_copy) == patched
    patches.revert()
    assert tree_hashes(sglang_copy) == before
