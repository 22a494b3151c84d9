"""eesd's GPU checks on a bare CUDA machine without network: the CUDA tests, then the tables.

Gathers the parts that `pack.py` made (``.gpu/part*/``) into a stash that outlives one copy of the
tree (``EESD_GPU_STASH``, default ``/tmp/eesd-gpu``). While parts are missing it says which and
exits 3; once all are there it installs the wheels and eesd into the stash, rebuilds SmolLM2's
checkpoint from its GGUF pieces, and runs each step below, each with its own time limit, writing
results and one log into OUT. A failing step is reported and the next one runs.

    bash benchmarks/gpu/run.sh OUT [--only STEP ...] [--skip STEP ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
MACHINE = "nvidia-h200"
CLI = [sys.executable, "-c", "import sys; from eesd_core.cli import main; sys.exit(main())"]
SDPA = "--sdpa flash,efficient,math"
NEED_MODEL = ("bench", "bench-batch", "costs")


def steps(out: Path, questions: Path, device: str) -> list[tuple[str, list[str], int]]:
    """(name, command, seconds allowed). The bench files are named as `benchmarks/results/` keeps them."""
    model = f"--model {MODEL} --device {device} --dtype bfloat16"
    bench = f"{model} --questions {questions} --max-new-tokens 64 {SDPA}"
    graphs = "eesd_plain_graphs eesd_default_graphs" if device.startswith("cuda") else ""  # CUDA only
    eesd = {
        "bench": f"bench {bench} --per-category 1 --methods hf hf_static eesd_plain eesd_default {graphs} "
        f"--no-memory --no-progress --out {out / 'bench'}",
        "bench-batch": f"bench-batch {bench} --batch-sizes 1 4 16 64 --methods hf eesd_plain eesd_default "
        f"{graphs} --repeats 2 --out {out / 'bench-batch'}",
        "costs": f"costs measure {model} --batch-sizes 1 4 16 {SDPA} "
        f"--out {out / f'{MACHINE}-{MODEL}-bfloat16.json'}",
    }
    tests = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "cuda",
        "-p",
        "no:cacheprovider",
        "tests/core/test_cuda.py",
        "tests/core/test_device_syncs.py",
        "tests/plugins/graphs/test_cuda_graphs.py",
    ]
    limits = {"bench": 300, "bench-batch": 240, "costs": 90}
    runs = [("cuda-tests", tests, 240)] + [(k, [*CLI, *shlex.split(v)], limits[k]) for k, v in eesd.items()]
    return runs + curves(out, device)


def curves(out: Path, device: str) -> list[tuple[str, list[str], int]]:
    """Cost curves of the 1.5B and 8B shapes (random weights) with passes captured into CUDA
    graphs, and the 1.5B shape's timed replay of the shipped trace's code prompts, eager and
    graphed; on a CPU, the same plumbing on four layers of static buffers."""
    script = [sys.executable, str(REPO / "benchmarks" / "cost_curves.py")]
    cuda = device.startswith("cuda")
    common = f"--device {device} --dtype bfloat16 --repeats 10 --compile {'graphs' if cuda else 'static'}"
    small = "" if cuda else " --layers 4 --context 64 --tokens 24"
    found = []
    for name, shape, extra, limit in (
        ("curves-1.5b", "qwen2.5-1.5b", "--exit-mlp-width 1536 --alpha 0.5", 180),
        ("curves-8b", "llama-3-8b", "--exit-layers 4,8" if cuda else "", 240),
    ):
        target = out / f"cost-curves-{shape}-graphs-{MACHINE}.json"
        found.append(
            (name, [*script, *shlex.split(f"--shape {shape} {common} {extra}{small} --out {target}")], limit)
        )
    replay = [sys.executable, str(REPO / "benchmarks" / "timed_replay.py")]
    choices = "off graphs" if cuda else "off static"
    sizes = "1 4 16 64" if cuda else "1 2 --layers 4 --repeats 1"
    target = out / f"timed-replay-qwen2.5-1.5b-{MACHINE}.json"
    settings = (
        f"--shape qwen2.5-1.5b --device {device} --dtype bfloat16 --compile {choices} --exit-mlp-width 1536"
    )
    settings += f" --categories own_code coding --batch-sizes {sizes} --out {target}"
    return [*found, ("replay-1.5b", [*replay, *shlex.split(settings)], 300)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", default=None, help="these steps, even if done before")
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--device", default="cuda", help="cpu: try the steps' plumbing without a GPU")
    args = parser.parse_args(argv)
    stash = Path(os.environ.get("EESD_GPU_STASH", "/tmp/eesd-gpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "log.txt").open("a")
    manifest = _gather(REPO / ".gpu", stash / "parts")
    have = {f.name for f in (stash / "parts").iterdir()}
    files = [n for n in manifest["files"] if n not in have]
    pieces = [n for n in manifest["pieces"] if n not in have]
    if files:
        _say(log, f"waiting for {', '.join(files + pieces)}: carry the other parts and run again")
        return 3
    env = _install(stash, manifest, log, model=not pieces)
    _say(log, _environment(env))
    failed, done = [], stash / "done"
    done.mkdir(exist_ok=True)
    for name, command, limit in steps(args.out, stash / "parts" / "question.jsonl", args.device):
        wanted = name in args.only if args.only is not None else not (done / name).exists()
        if not wanted or name in args.skip or (pieces and name in NEED_MODEL):
            continue
        if _step(name, command, limit, env, log):
            (done / name).touch()
        else:
            failed.append(name)
    _collect(args.out)
    if pieces:
        _say(log, f"waiting for {', '.join(pieces)} to run {', '.join(NEED_MODEL)}: carry the other parts")
        return 3
    _say(log, f"done; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


def _gather(source: Path, parts: Path) -> dict:
    """Copy what arrived in ``source/part*/`` into ``parts``; the manifest names the whole."""
    parts.mkdir(parents=True, exist_ok=True)
    for folder in sorted(source.glob("part*")):
        for file in folder.iterdir():
            if not (parts / file.name).exists() or file.name == "manifest.json":
                shutil.copyfile(file, parts / file.name)
    if not (parts / "manifest.json").exists():
        raise SystemExit(f"no part has arrived: make them with benchmarks/gpu/pack.py and carry {source}")
    return json.loads((parts / "manifest.json").read_text())


def _install(stash: Path, manifest: dict, log, model: bool) -> dict[str, str]:
    """Wheels and eesd into ``stash/site`` and SmolLM2 into ``stash/cache``, once; the environment."""
    site, cache = stash / "site", stash / "cache"
    env = dict(os.environ, PYTHONPATH=str(site), EESD_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    pip += ["--disable-pip-version-check", "--upgrade", "--target", str(site)]
    if not (site / ".done").exists():
        wheels = [str(stash / "parts" / n) for n in manifest["files"] if n.endswith(".whl")]
        subprocess.run([*pip, *wheels], check=True)
        subprocess.run([*pip, "--no-build-isolation", str(REPO)], check=True, cwd="/tmp")
        (site / ".done").touch()
    parts = cache / "models" / f".parts-{MODEL}"
    gguf = parts / manifest["gguf"]
    if model and not (cache / "models" / MODEL).exists():
        parts.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with gguf.open("wb") as whole:
            for name in manifest["pieces"]:
                data = (stash / "parts" / name).read_bytes()
                digest.update(data)
                whole.write(data)
        if digest.hexdigest() != manifest["sha256"]:
            gguf.unlink()
            raise SystemExit("the GGUF pieces do not make the file packed (sha256 differs): pack again")
        _step("model", [*CLI, "models", "fetch", MODEL], 300, env, log)
    return env


def _step(name: str, command: list[str], limit: int, env: dict[str, str], log) -> bool:
    """Run one step into the log; a failing step's last lines are printed too."""
    _say(log, f"== {name}: {' '.join(command)}")
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as output:
        try:
            done = subprocess.run(
                command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, timeout=limit
            )
            ok, status = done.returncode == 0, f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            ok, status = False, f"stopped after {limit} s"
        output.seek(0)
        text = output.read()
    log.write(text)
    if not ok:
        print("\n".join(text.splitlines()[-25:]))
    _say(log, f"== {name}: {status} in {time.monotonic() - started:.0f} s")
    return ok


def _environment(env: dict[str, str]) -> str:
    code = "import torch, transformers; p = torch.cuda.get_device_properties(0); "
    code += "print(torch.__version__, transformers.__version__, p.name, p.total_memory >> 30, 'GiB')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return (done.stdout or done.stderr).strip()


def _collect(out: Path) -> None:
    """Each run's JSON beside the log, named `<benchmark>-<model>-<machine>.json`."""
    for kind in ("bench", "bench-batch"):
        found = sorted((out / kind).glob("*.json")) if (out / kind).exists() else []
        if found:
            shutil.copyfile(found[0], out / f"{kind}-{MODEL}-{MACHINE}.json")
            shutil.rmtree(out / kind)


def _say(log, text: str) -> None:
    print(text, flush=True)
    log.write(text + "\n")
    log.flush()


if __name__ == "__main__":
    sys.exit(main())
