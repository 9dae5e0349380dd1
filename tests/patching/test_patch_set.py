"""apply / revert / check / status on a private copy of the real installed SGLang."""

from __future__ import annotations

import base64
import csv
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_prefill_ext import adapters
from sglang_prefill_ext.patching import PatchError, PatchSet, supported_versions, unidiff

REPO = Path(__file__).resolve().parents[2]


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def record_mismatches(site: Path, version: str) -> list[str]:
    """The files of SGLang's RECORD in `site` (not pip's bin/ scripts) whose sha256 is not the
    RECORD's, or that are missing."""
    with open(site / f"sglang-{version}.dist-info" / "RECORD", encoding="utf-8", newline="") as f:
        rows = [(name, digest) for name, digest, *_ in csv.reader(f) if digest and not name.startswith("../")]
    differ = []
    for name, digest in rows:
        path = site / name
        data = path.read_bytes() if path.is_file() else None
        if data is None or digest != "sha256=" + base64.urlsafe_b64encode(
            hashlib.sha256(data).digest()
        ).rstrip(b"=").decode("ascii"):
            differ.append(name)
    return sorted(differ)


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


def test_cli_defaults_to_the_installed_version(sglang_copy: Path, sglang_version: str) -> None:
    before = tree_hashes(sglang_copy)
    where = ("--sglang-dir", str(sglang_copy))
    status = cli("status", *where)
    assert status.returncode == 0 and status.stdout.strip().endswith(
        f"{sglang_version} in {sglang_copy}: not applied"
    )
    assert "apply would change" in cli("check", *where).stdout
    assert tree_hashes(sglang_copy) == before, "check must not write"
    assert cli("apply", *where).returncode == 0
    second = cli("apply", "--sglang-version", sglang_version, *where)
    assert second.returncode == 0 and "already applied" in second.stdout
    assert cli("status", *where).stdout.strip().endswith(": applied")
    assert cli("revert", *where).returncode == 0
    assert tree_hashes(sglang_copy) == before


def test_unknown_version_refused_on_one_line(sglang_copy: Path) -> None:
    before = tree_hashes(sglang_copy)
    result = cli("apply", "--sglang-version", "0.4.0", "--sglang-dir", str(sglang_copy))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no patches for SGLang 0.4.0" in result.stderr
    for version in supported_versions():
        assert version in result.stderr
    assert tree_hashes(sglang_copy) == before


def test_make_refuses_an_unsupported_version_by_name() -> None:
    result = subprocess.run(
        ["make", "-C", str(REPO), "apply", "SGLANG_VERSION=0.5.99"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert (
        f"SGLang 0.5.99 is not supported; supported versions: {' '.join(supported_versions())}"
        in result.stderr
    )


def test_make_patches_the_given_python_s_sglang_without_a_venv(sglang_copy: Path) -> None:
    """`make status|apply|revert PYTHON=...` runs the CLI with that interpreter and builds nothing."""
    before = tree_hashes(sglang_copy)

    def make(verb: str) -> str:
        argv = ["make", "-s", "-C", str(REPO), verb, f"PYTHON={sys.executable}", f"SGLANG_DIR={sglang_copy}"]
        result = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert "venv" not in result.stdout + result.stderr
        return result.stdout

    assert make("status").strip().endswith(": not applied")
    make("apply")
    assert make("status").strip().endswith(": applied")
    make("revert")
    assert tree_hashes(sglang_copy) == before


def test_one_supported_version_list() -> None:
    """The patch folders are the list: each has an adapter package and pinned requirements, and
    no adapter package exists without them."""
    versions = supported_versions()
    assert versions
    for version in versions:
        assert adapters.for_version(version).__name__.endswith(adapters.package_name(version))
        assert (REPO / "requirements" / f"sglang-{version}.txt").is_file()
    packages = {p.name for p in Path(adapters.__file__).parent.glob("v*_*") if p.is_dir()}
    assert packages == {adapters.package_name(v) for v in versions}
    with pytest.raises(LookupError, match="supported versions"):
        adapters.for_version("0.5.99")


def test_installed_version_mismatch_refused(sglang_copy: Path, sglang_version: str) -> None:
    version_file = sglang_copy / "sglang" / "_version.py"
    version_file.write_text(version_file.read_text().replace(f"'{sglang_version}'", "'0.5.16'"))
    before = tree_hashes(sglang_copy)
    with pytest.raises(PatchError, match=f"is 0.5.16, not {sglang_version}"):
        PatchSet(sglang_version, sglang_copy)
    assert tree_hashes(sglang_copy) == before


def test_not_an_sglang_folder_refused(tmp_path: Path, sglang_version: str) -> None:
    with pytest.raises(PatchError, match="not an SGLang install"):
        PatchSet(sglang_version, tmp_path)


def test_missing_record_refused(sglang_copy: Path, sglang_version: str) -> None:
    (sglang_copy / f"sglang-{sglang_version}.dist-info" / "RECORD").unlink()
    before = tree_hashes(sglang_copy)
    with pytest.raises(PatchError, match="RECORD is missing"):
        PatchSet(sglang_version, sglang_copy)
    assert tree_hashes(sglang_copy) == before


def test_hand_modified_hunk_refused_without_partial_writes(sglang_copy: Path, sglang_version: str) -> None:
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


@pytest.mark.parametrize("applied", [False, True], ids=["stock", "patched"])
def test_foreign_edit_outside_the_hunks_refused(
    sglang_copy: Path, sglang_version: str, applied: bool
) -> None:
    """A line appended far from every hunk still makes the file foreign: files are judged whole,
    against SGLang's RECORD hash."""
    patches = PatchSet(sglang_version, sglang_copy)
    if applied:
        patches.apply()
    edited = next(t for t in patches.targets if t.diff.path.endswith("server_args.py"))
    with open(edited.path, "a", encoding="utf-8") as f:
        f.write("# a local edit\n")
    before = tree_hashes(sglang_copy)
    assert patches.status() == f"foreign changes: {edited.path} (changed by hand)"
    status = cli("status", "--sglang-dir", str(sglang_copy))
    assert status.returncode == 1 and str(edited.path) in status.stdout
    for verb in ("apply", "revert", "check"):
        result = cli(verb, "--sglang-dir", str(sglang_copy))
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and "refused, nothing changed" in result.stderr
        assert str(edited.path) in result.stderr
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
