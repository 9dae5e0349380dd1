"""README is a map of at most 200 lines whose numbers each link to their entry in bench/RESULTS.md;
bench/results/ holds evidence only (markdown, images, one archive per run), and every
`<run>.tar.xz:PATH` a results page cites is in that archive."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
INDEX = REPO / "bench" / "RESULTS.md"


def test_readme_is_short() -> None:
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 200


def test_readme_numbers_link_to_their_index_entry() -> None:
    index = INDEX.read_text(encoding="utf-8")
    links = re.findall(
        r"\[(\d[^\]]*)\]\(bench/RESULTS\.md#([\w-]+)\)", (REPO / "README.md").read_text("utf-8")
    )
    assert links
    for number, anchor in links:
        row = next((line for line in index.splitlines() if f'<a id="{anchor}"></a>' in line), None)
        assert row is not None, anchor
        assert number.replace("×", "") in row.replace("×", "").replace("*", ""), (number, row)


def test_results_hold_evidence_only() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "bench/results"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked
    assert all(Path(p).suffix in (".md", ".png") or p.endswith(".tar.xz") for p in tracked), tracked
    assert all(Path(p).parent == Path("bench/results") for p in tracked), "one folder, no raw/ tree"


def test_cited_archive_members_exist() -> None:
    members: dict[str, list[str]] = {}
    for page in sorted(RESULTS.glob("*.md")):
        for run, path in re.findall(r"([\w.-]+)\.tar\.xz:([^\s`)\],;{]+)", page.read_text(encoding="utf-8")):
            if run not in members:
                with tarfile.open(RESULTS / f"{run}.tar.xz") as archive:
                    members[run] = archive.getnames()
            wanted = f"{run}/{path}".rstrip("/")
            assert any(fnmatch.fnmatch(m, wanted) or m.startswith(wanted) for m in members[run]), (
                page,
                wanted,
            )


def test_cited_results_files_exist() -> None:
    pages = [REPO / "README.md", INDEX, *RESULTS.glob("*.md"), *(REPO / "docs").glob("*.md")]
    for page in pages:
        for cited in re.findall(
            r"bench/results/([\w.-]+\.(?:md|png|tar\.xz))", page.read_text(encoding="utf-8")
        ):
            assert (RESULTS / cited).is_file(), (page, cited)
        if page.parent == RESULTS.parent or page == INDEX:
            for cited in re.findall(r"\]\(results/([\w.-]+)\)", page.read_text(encoding="utf-8")):
                assert (RESULTS / cited).is_file(), (page, cited)
