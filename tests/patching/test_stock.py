"""The way back from a hand-edited SGLang: the refusal's pip line, and `revert --force-stock` from
SGLang's wheel. The wheel is a stand-in built from the pristine copy with zipfile (the real one
needs the network): the files of the installed RECORD, which is what `--force-stock` checks."""

from __future__ import annotations

import csv
import hashlib
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sglang_prefill_ext.patching import PatchSet
from tests.patching.test_patch_set import cli, record_mismatches, tree_hashes


def stand_in_wheel(site: Path, version: str, folder: Path) -> Path:
    """A wheel of every file SGLang's RECORD hashes in `site` (pip's bin/ scripts aside) and the
    RECORD itself."""
    record = f"sglang-{version}.dist-info/RECORD"
    with open(site / record, encoding="utf-8", newline="") as f:
        names = [name for name, digest, *_ in csv.reader(f) if digest and not name.startswith("../")]
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name in [*names, record]:
            z.write(site / name, name)
    return wheel


def package_hashes(site: Path) -> dict[str, str]:
    """sglang/'s files but the bytecode pip compiles when it installs."""
    return {k: v for k, v in tree_hashes(site / "sglang").items() if "__pycache__" not in k}


def server_args(site: Path) -> Path:
    return site / "sglang" / "srt" / "server_args.py"


def edit_by_hand(site: Path) -> Path:
    with open(server_args(site), "a", encoding="utf-8") as f:
        f.write("# a local edit\n")
    return server_args(site)


def test_refusal_ends_with_the_pip_line(sglang_site: Path, sglang_version: str, sglang_dir: Path) -> None:
    """Every verb is refused on one line that ends with the pip command putting stock files back:
    for this interpreter's own site-packages the plain reinstall, for another folder `--target`."""
    edited = edit_by_hand(sglang_site)
    before = tree_hashes(sglang_site)
    pip_line = (
        f"{sys.executable} -m pip install --force-reinstall --no-deps --upgrade --target {sglang_site} "
        f"sglang=={sglang_version}"
    )
    for verb in ("apply", "revert", "check"):
        result = cli(verb, "--sglang-dir", str(sglang_site))
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and str(edited) in result.stderr
        assert "revert --force-stock" in result.stderr
        assert result.stderr.rstrip("\n").endswith(f", or {pip_line}")
    status = cli("status", "--sglang-dir", str(sglang_site))
    assert status.returncode == 1 and status.stdout.rstrip("\n").endswith(pip_line)
    assert tree_hashes(sglang_site) == before
    own = PatchSet(sglang_version, sglang_dir).way_back()
    assert own.endswith(
        f", or {sys.executable} -m pip install --force-reinstall --no-deps sglang=={sglang_version}"
    )


def test_the_pip_line_restores_stock(tmp_path: Path, sglang_site: Path, sglang_version: str) -> None:
    """The refusal's command, run with the stand-in wheel as pip's only source, puts back every
    file of the RECORD."""
    wheels = tmp_path / "wheels"
    stand_in_wheel(sglang_site, sglang_version, wheels)
    stock = package_hashes(sglang_site)
    patches = PatchSet(sglang_version, sglang_site)
    patches.apply()
    edit_by_hand(sglang_site)
    pip_line = patches.way_back().rsplit(", or ", 1)[1]
    env = {
        **os.environ,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    subprocess.run([*shlex.split(pip_line), "-q"], env=env, check=True, capture_output=True)
    assert package_hashes(sglang_site) == stock
    assert record_mismatches(sglang_site, sglang_version) == []  # pip's new RECORD
    assert patches.status() == "not applied"


def test_force_stock_restores_from_the_given_wheel(
    tmp_path: Path, sglang_site: Path, sglang_version: str
) -> None:
    """Patched, hand-edited and deleted files all come back byte-identical to the RECORD."""
    wheel = stand_in_wheel(sglang_site, sglang_version, tmp_path / "wheels")
    before = tree_hashes(sglang_site)
    PatchSet(sglang_version, sglang_site).apply()
    edit_by_hand(sglang_site)
    (sglang_site / "sglang" / "launch_server.py").unlink()
    changed = record_mismatches(sglang_site, sglang_version)
    assert "sglang/launch_server.py" in changed and "sglang/srt/server_args.py" in changed
    assert cli("revert", "--sglang-dir", str(sglang_site)).returncode == 2
    result = cli("revert", "--force-stock", "--wheel", str(wheel), "--sglang-dir", str(sglang_site))
    assert result.returncode == 0, result.stderr
    assert f"restored {len(changed)} files from {wheel}" in result.stdout
    assert record_mismatches(sglang_site, sglang_version) == []
    assert tree_hashes(sglang_site) == before
    again = cli("revert", "--force-stock", "--wheel", str(wheel), "--sglang-dir", str(sglang_site))
    assert again.returncode == 0 and "nothing to do" in again.stdout


def pip_cache(tmp_path: Path, wheel: Path | None) -> dict[str, str]:
    """An environment whose pip cache holds `wheel` as pip 23.3+ keeps a download (a hashed
    `.body` file under http-v2/), or nothing."""
    cache = tmp_path / "pip-cache"
    body = cache / "http-v2" / "a" / "b" / "c" / f"{hashlib.sha256(b'sglang').hexdigest()}.body"
    body.parent.mkdir(parents=True)
    if wheel is not None:
        wheel.rename(body)
    return {**os.environ, "PIP_CACHE_DIR": str(cache)}


def cli_in(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_prefill_ext.cli", *args], env=env, capture_output=True, text=True
    )


def test_force_stock_finds_the_wheel_in_pip_s_cache(
    tmp_path: Path, sglang_site: Path, sglang_version: str
) -> None:
    env = pip_cache(tmp_path, stand_in_wheel(sglang_site, sglang_version, tmp_path / "wheels"))
    before = tree_hashes(sglang_site)
    edit_by_hand(sglang_site)
    result = cli_in(env, "revert", "--force-stock", "--sglang-dir", str(sglang_site))
    assert result.returncode == 0, result.stderr
    assert "restored 1 file from" in result.stdout and "http-v2" in result.stdout
    assert tree_hashes(sglang_site) == before


@pytest.mark.parametrize("source", ["no wheel", "other content"])
def test_force_stock_without_a_matching_wheel_writes_nothing(
    tmp_path: Path, sglang_site: Path, sglang_version: str, source: str
) -> None:
    """No wheel in pip's cache, or one whose copy of an edited file is not the RECORD's: refused on
    one line ending with the pip line, nothing written."""
    edit_by_hand(sglang_site)
    wheel = stand_in_wheel(sglang_site, sglang_version, tmp_path / "wheels") if source != "no wheel" else None
    env = pip_cache(tmp_path, wheel)
    (sglang_site / "sglang" / "launch_server.py").unlink()  # a second file to restore: none may be written
    before = tree_hashes(sglang_site)
    result = cli_in(env, "revert", "--force-stock", "--sglang-dir", str(sglang_site))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "nothing changed" in result.stderr
    assert f"no usable sglang-{sglang_version} wheel in pip's cache" in result.stderr
    if wheel is not None:
        assert "sglang/srt/server_args.py does not hash as SGLang's RECORD says" in result.stderr
    assert result.stderr.rstrip("\n").endswith(f"--target {sglang_site} sglang=={sglang_version}")
    assert tree_hashes(sglang_site) == before
