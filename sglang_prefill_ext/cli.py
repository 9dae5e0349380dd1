"""`sglang-prefill-ext {apply,revert,check,status}`: manage the patches on an installed SGLang;
`sglang-prefill-ext doctor LOG ...`: why prompts miss the prefix cache (`doctor/command.py`);
`sglang-prefill-ext flags [--markdown]`: the `--prefill-ext-*` flags and their defaults (`flag_table.py`).

By default the SGLang this Python imports, at its installed version. `revert --force-stock` puts
back every file of SGLang that is not as its RECORD says (patched, changed by hand, missing) from
SGLang's wheel (`--wheel PATH`, else pip's cache), checked against the RECORD first. Exit codes: 0
done (or nothing to do; `status`: applied or not applied); 1 `status` found a partially applied or
foreign (hand-changed, missing) file; 2 refused (unsupported or mismatched version, no SGLang, a
foreign change, no matching wheel): nothing was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_prefill_ext.patching import PatchError, PatchSet, installed_sglang_dir, installed_version
from sglang_prefill_ext.patching.stock import restore_stock

EXIT_ATTENTION = 1
EXIT_REFUSED = 2


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _force_stock(patches: PatchSet, wheel: Path | None) -> str:
    used, changed = restore_stock(patches.sglang_dir, patches.version, wheel)
    if used is None:
        return "revert: nothing to do (every file is as SGLang's RECORD says)"
    return f"revert: restored {_files(len(changed))} from {used}:\n  " + "\n  ".join(changed)


def _run(verb: str, patches: PatchSet) -> tuple[int, str]:
    if verb == "status":
        status = patches.status()
        code = 0 if status in ("applied", "not applied") else EXIT_ATTENTION
        if status.startswith("foreign changes"):
            status += f"; back to stock: {patches.way_back()}"
        return code, f"SGLang {patches.version} in {patches.sglang_dir}: {status}"
    if verb == "check":
        if patches.status() == "applied":
            return (
                0,
                f"check: already applied; revert would change {_files(len(patches.check(forward=False)))}",
            )
        return 0, "check: apply would change:\n  " + "\n  ".join(patches.check(forward=True))
    changed = patches.apply() if verb == "apply" else patches.revert()
    if not changed:
        return 0, f"{verb}: nothing to do (already {'applied' if verb == 'apply' else 'reverted'})"
    return 0, f"{verb}: changed {_files(len(changed))}:\n  " + "\n  ".join(changed)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        from sglang_prefill_ext.doctor import command

        return command.main(argv[1:])
    if argv[:1] == ["flags"]:
        from sglang_prefill_ext import flag_table

        return flag_table.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="sglang-prefill-ext", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("verb", choices=["apply", "revert", "check", "status", "doctor", "flags"])
    parser.add_argument(
        "--sglang-version",
        default=None,
        help="refuse unless the SGLang found is this version (default: whichever is installed)",
    )
    parser.add_argument(
        "--sglang-dir",
        type=Path,
        default=None,
        help="folder holding the sglang/ package (default: the one this Python imports)",
    )
    parser.add_argument(
        "--force-stock",
        action="store_true",
        help="revert only: restore every file that differs from SGLang's RECORD from SGLang's wheel",
    )
    parser.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="with --force-stock: SGLang's wheel, or a folder holding it (default: search pip's cache)",
    )
    args = parser.parse_args(argv)
    if args.force_stock and args.verb != "revert":
        parser.error("--force-stock goes with revert only")
    if args.wheel is not None and not args.force_stock:
        parser.error("--wheel goes with revert --force-stock only")
    try:
        sglang_dir = args.sglang_dir or installed_sglang_dir()
        version = args.sglang_version or installed_version(sglang_dir)
        patches = PatchSet(version, sglang_dir)
        code, message = (
            (0, _force_stock(patches, args.wheel)) if args.force_stock else _run(args.verb, patches)
        )
    except PatchError as e:
        print(f"sglang-prefill-ext {args.verb}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
