"""The wheels qeval's transformers path needs on the GPU machine that its image lacks:

    make gpu-bundle                 # = .venv/bin/python scripts/gpu_bundle.py --out build/gpu-bundle

The GPU machine (README, "What ran on a GPU") has no network and its own image: Python 3.12,
torch with CUDA, transformers 5.17, accelerate, numpy, scipy, pandas, jinja2, rich, typer, pyyaml,
safetensors, psutil, nvidia-ml-py, huggingface-hub, tokenizers, ninja; no pydantic and no
optimum-quanto. What travels there is the working tree plus the folders a call carries, 64 MiB
in all, so this writes only what is missing, as CPython 3.12 manylinux x86-64 wheels, pinned to
the versions this checkout's .venv holds (constraints.txt pins transformers and optimum-quanto),
and fails (exit 1) when the bundle passes BUNDLE_LIMIT_MIB or bundle and working tree together
pass the carry limit less CARRY_SLACK_MIB. It prints every wheel's size and the totals.

What is carried and why (`BUNDLE`); what is not:
- ninja: on the image. optimum-quanto needs it only to compile its own CUDA kernels on first use
  (AWQ int4 for float16 scales, Marlin FP8); the bfloat16 models run here take kernels torch
  ships (int4 groups of 128: TinyGemm, torch's _weight_int4pack_mm; int8: a dequantizing matmul),
  so nothing is compiled. A float16 model's INT4 weights would start an nvcc build of minutes.
- huggingface-hub, tokenizers, safetensors, numpy, packaging, regex, tqdm, typer, pyyaml: on the
  image, in versions transformers 5.23.0 accepts (hub >= 1.31, tokenizers >= 0.23.1 < 0.24,
  safetensors >= 0.8; the image: 1.33.0, 0.23.2, 0.8.0).
- lm-eval, vllm, compressed-tensors, ray, mlflow, datasets: off the path (tests/e2e/test_gpu_run.py
  blocks their imports while it runs scripts/gpu_run.py).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
#: the device tool's limit on what one call carries, the working tree included
CARRY_LIMIT_MIB = 64
#: kept free of the carry limit: the tree grows (reports, notes) between a build and a call
CARRY_SLACK_MIB = 8
#: the bundle alone: about 16 MiB today (transformers is 13 of them); room to grow, not to double
BUNDLE_LIMIT_MIB = 40

#: distribution -> why the GPU machine needs it from here
BUNDLE = {
    "pydantic": "qeval's config, setups and results are pydantic models; the image has no pydantic",
    "pydantic-core": "pydantic's compiled core (the one cp312 manylinux x86-64 wheel)",
    "annotated-types": "required by pydantic",
    "typing-inspection": "required by pydantic",
    "typing-extensions": "pydantic needs >= 4.16; the image's version is not known to be as new",
    "optimum-quanto": "INT8 and INT4 weights and the INT4 KV cache (qeval/backends/hf/quant.py, kv_cache.py)",
    "transformers": "the version qeval's tests ran on (constraints.txt: the Cache layer API qeval builds on); "
    "the image's is 5.17",
}
#: the wheel tags the GPU machine's CPython 3.12 on x86-64 installs
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)"
    r"-(?P<plat>[^-]+)\.whl$"
)


def normalize(name: str) -> str:
    """A distribution name as wheel file names and PEP 503 compare it (pydantic_core == pydantic-core)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(names: list[str] | None = None) -> dict[str, str]:
    """Each bundled distribution's version as the running interpreter (this checkout's .venv) has it."""
    out = {}
    for name in names or list(BUNDLE):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            raise SystemExit(
                f"gpu_bundle: {name} is not installed in {sys.executable}: run `make install` first, "
                "the bundle pins .venv's versions"
            ) from None
    return out


@dataclass(frozen=True)
class Wheel:
    """One wheel file of the bundle, parsed from its name."""

    path: Path
    name: str
    version: str
    tags: tuple[str, str, str]

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def parse_wheel(path: Path) -> Wheel | None:
    """The wheel's distribution, version and tags from its file name; None for anything else."""
    m = _WHEEL.match(path.name)
    if not m:
        return None
    return Wheel(path, normalize(m["name"]), m["version"], (m["py"], m["abi"], m["plat"]))


def installable_there(w: Wheel) -> bool:
    """Whether CPython 3.12 on manylinux x86-64 installs this wheel."""
    py, abi, plat = w.tags
    pure = abi == "none" and plat == "any" and any(t in ("py3", "cp312") for t in py.split("."))
    native = "cp312" in py.split(".") and abi in ("cp312", "abi3") and any(p in PLATFORMS for p in plat.split("."))
    return pure or native


def check_bundle(folder: Path, wanted: dict[str, str], limit_mib: float = BUNDLE_LIMIT_MIB) -> list[str]:
    """What is wrong with the bundle in `folder` against the pins `wanted`: a wheel missing, two of
    one distribution (one stops the whole install there), a version or platform other than the
    pinned one, a file that is not a wheel, or a size past `limit_mib`. Empty when it is right."""
    if not folder.is_dir():
        return [f"{folder}: no such folder (run `make gpu-bundle`)"]
    problems = []
    files = sorted(p for p in folder.iterdir() if p.is_file())
    wheels = []
    for p in files:
        w = parse_wheel(p)
        if w is None:
            problems.append(f"{p.name}: not a wheel")
        else:
            wheels.append(w)
    by_name: dict[str, list[Wheel]] = {}
    for w in wheels:
        by_name.setdefault(w.name, []).append(w)
    want = {normalize(k): v for k, v in wanted.items()}
    for name, ver in want.items():
        found = by_name.get(name, [])
        if not found:
            problems.append(f"{name}=={ver}: missing")
        elif len(found) > 1:
            problems.append(f"{name}: {len(found)} wheels ({', '.join(w.path.name for w in found)}); keep one")
        elif found[0].version != ver:
            problems.append(f"{name}: {found[0].version} where .venv has {ver}")
    for name, found in by_name.items():
        if name not in want:
            problems.append(f"{name}: not in the bundle's list (scripts/gpu_bundle.py BUNDLE)")
        problems += [
            f"{w.path.name}: not installable on CPython 3.12 manylinux x86-64"
            for w in found
            if not installable_there(w)
        ]
    total = sum(p.stat().st_size for p in files)
    if total > limit_mib * MIB:
        problems.append(f"bundle is {total / MIB:.1f} MiB, over its limit of {limit_mib:g} MiB")
    return problems


def tree_sizes(root: Path = ROOT) -> dict[str, int]:
    """Bytes per top-level entry of what the device tool sends besides carried folders: tracked
    files and untracked ones git does not ignore (a file deleted but still tracked counts 0)."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    ).stdout
    sizes: dict[str, int] = {}
    for rel in out.decode().split("\0"):
        p = root / rel
        if rel and p.is_file() and not p.is_symlink():
            top = rel.split("/")[0]
            sizes[top] = sizes.get(top, 0) + p.stat().st_size
    return sizes


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the working tree that travels (tree_sizes, summed)."""
    return sum(tree_sizes(root).values())


def largest(sizes: dict[str, int], n: int = 3) -> str:
    """The n largest entries, for a message that says what to ignore or delete."""
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in top)


def download(wanted: dict[str, str], dest: Path) -> None:
    """pip download each pinned wheel for CPython 3.12 manylinux x86-64, without dependencies
    (BUNDLE names every one the image lacks)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "-d",
        str(dest),
    ]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += [f"{name}=={ver}" for name, ver in wanted.items()]
    subprocess.run(cmd, check=True)


def summary(folder: Path, tree: int) -> list[str]:
    """The lines printed: each wheel and its size, the bundle, and bundle plus tree against the limit."""
    wheels = sorted(folder.glob("*.whl"))
    lines = [f"  {w.name:<80} {w.stat().st_size / MIB:6.2f} MiB" for w in wheels]
    total = sum(w.stat().st_size for w in wheels)
    lines.append(
        f"gpu_bundle: {folder}: {len(wheels)} wheels, {total / MIB:.1f} MiB (limit {BUNDLE_LIMIT_MIB} MiB); "
        f"with the working tree ({tree / MIB:.1f} MiB): {(total + tree) / MIB:.1f} MiB of the "
        f"{CARRY_LIMIT_MIB} MiB a device call carries"
    )
    return lines


def build(out: Path) -> int:
    """Download into a fresh folder beside `out`, check it, then put it in place (a failed build
    leaves the previous bundle as it was). 0 when the bundle is right and within the limits."""
    wanted = pins()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gpu-bundle-", dir=out.parent))
    try:
        download(wanted, tmp)
        problems = check_bundle(tmp, wanted)
        sizes = tree_sizes()
        tree = sum(sizes.values())
        bundle = sum(p.stat().st_size for p in tmp.iterdir())
        if bundle + tree > (CARRY_LIMIT_MIB - CARRY_SLACK_MIB) * MIB:
            problems.append(
                f"bundle and working tree are {(bundle + tree) / MIB:.1f} MiB, past the carry limit "
                f"less {CARRY_SLACK_MIB} MiB of slack ({CARRY_LIMIT_MIB - CARRY_SLACK_MIB} MiB); the "
                f"tree's largest untracked-or-tracked entries: {largest(sizes)} (ignore or delete what "
                "need not travel)"
            )
        if problems:
            print("gpu_bundle: " + "; ".join(problems), file=sys.stderr)
            return 1
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    print("\n".join(summary(out, tree)))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-bundle")
    ap.add_argument("--check", action="store_true", help="check an existing bundle (no download)")
    args = ap.parse_args()
    if args.check:
        problems = check_bundle(args.out, pins())
        if problems:
            sys.exit("gpu_bundle: " + "; ".join(problems))
        print("\n".join(summary(args.out, tree_bytes())))
        return
    sys.exit(build(args.out))


if __name__ == "__main__":
    main()
