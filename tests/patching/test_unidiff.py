from __future__ import annotations

import pytest

from sglang_prefill_ext.patching import unidiff

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))
PATCH = """--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -2,3 +2,4 @@
 line 2
 line 3
+inserted
 line 4
@@ -15,3 +16,3 @@
 line 15
-line 16
+changed 16
 line 17
"""


def test_apply_then_reverse_is_byte_identical() -> None:
    (diff,) = unidiff.parse(PATCH)
    assert diff.path == "pkg/mod.py"
    patched = unidiff.apply(diff, ORIGINAL)
    assert patched is not None
    assert "inserted\n" in patched and "changed 16\n" in patched and "line 16\n" not in patched
    assert unidiff.apply(diff.reversed(), patched) == ORIGINAL


def test_hunks_found_when_lines_moved() -> None:
    (diff,) = unidiff.parse(PATCH)
    shifted = "header\n" * 5 + ORIGINAL
    patched = unidiff.apply(diff, shifted)
    assert patched is not None and patched.startswith("header\n" * 5)


def test_no_fuzz_on_changed_context() -> None:
    (diff,) = unidiff.parse(PATCH)
    assert unidiff.apply(diff, ORIGINAL.replace("line 17\n", "line 17 # edited\n")) is None
    assert unidiff.apply(diff.reversed(), ORIGINAL) is None


def test_missing_final_newline_round_trips() -> None:
    text = "a\nb\nc"
    patch = "--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n b\n-c\n\\ No newline at end of file\n+C\n\\ No newline at end of file\n"
    (diff,) = unidiff.parse(patch)
    assert unidiff.apply(diff, text) == "a\nb\nC"
    assert unidiff.apply(diff.reversed(), "a\nb\nC") == text


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "--- a/f\n@@ -1 +1 @@\n-x\n+y\n",
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-x\n+y\n",
        "--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n",
    ],
)
def test_malformed_patches_rejected(bad: str) -> None:
    with pytest.raises(unidiff.PatchFormatError):
        unidiff.parse(bad)
