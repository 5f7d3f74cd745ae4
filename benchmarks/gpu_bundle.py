"""The wheel bundle for a GPU node without network (issue 41): built for the node's Python, checked.

The node's image brings torch, Lightning, transformers and more (`benchmarks/gpu_image.txt`, a
record of what is known of it); the check (`gpu_check.sh`) needs some packages it lacks. This
script

- ``build OUT``: puts into OUT the wheels of what the check needs (`CHECK_NEEDS`, with this
  project's version bounds from pyproject.toml) and what those need in turn, for the node's Python
  and platform (`pip download --only-binary=:all: --python-version ... --platform ...`), at the
  versions of the environment running this script (the node runs what the tests ran), carrying
  only a package that the image lacks or has at a version the requirement refuses;
  antlr4-python3-runtime ships only a source archive, so its wheel is built (`pip wheel`);
  a wheel already in OUT is not fetched again;
- ``verify OUT``: refuses a bundle over `LIMIT_MIB`, a wheel of a package that the image already
  has at an accepted version, and any wheel that does not install on the node's Python: pip
  resolves the check's needs with the image's packages (stand-in wheels of their recorded
  versions, no dependencies) and the bundle, `pip install --dry-run --no-index --target ...
  --python-version ... --only-binary=:all:`, with every bundle wheel named, so that a wheel
  for another Python (a cp311 wheel for a 3.12 node) fails as it would on the node.

    python benchmarks/gpu_bundle.py build .whl && python benchmarks/gpu_bundle.py verify .whl

The image's own packages are taken as consistent among themselves (they were installed together);
their stand-ins carry no dependencies, so the dry run checks the bundle against the image, not the
image against itself.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "benchmarks" / "gpu_image.txt"
LIMIT_MIB = 40
"""The bundle travels with the working tree to the node; over this it is refused (issue 41)."""
CHECK_NEEDS = ("torch", "lightning", "hydra-core", "omegaconf", "faiss-cpu", "transformers",
               "huggingface-hub", "numpy", "scipy", "pandas", "matplotlib")
"""What the check's processes import beyond the standard library (gpu_check.py and the code it
runs: train.py's path, the probes and their plots, FAISS, the hub stand-in and tiny models)."""
SOURCE_ONLY = ("antlr4-python3-runtime",)
"""Packages on PyPI as a source archive only: their wheel is built here (pure Python)."""


class BundleError(RuntimeError):
    """The bundle cannot be built or would not install on the node; the message says why."""


@dataclass
class Image:
    """The node's Python, its platform tags and its packages (canonical name -> version)."""

    python: str
    platforms: list[str]
    packages: dict[str, Version]

    @property
    def python_short(self) -> str:
        return ".".join(self.python.split(".")[:2])

    def markers(self) -> dict[str, str]:
        """The environment markers of a CPython on x86_64 Linux at the image's version."""
        return {"python_version": self.python_short, "python_full_version": self.python,
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                "platform_machine": "x86_64", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "extra": ""}


def read_image(path: Path = IMAGE) -> Image:
    """Parse gpu_image.txt: `python X.Y.Z`, `platform TAG...`, then `name==version` lines."""
    python, platforms, packages = None, [], {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        word, _, rest = line.partition(" ")
        if word == "python":
            python = rest.strip()
        elif word == "platform":
            platforms = rest.split()
        elif "==" in line:
            name, version = line.split("==", 1)
            packages[canonicalize_name(name.strip())] = Version(version.strip())
        else:
            raise BundleError(f"{path}:{number}: expected `python X.Y.Z`, `platform TAG ...` or "
                              f"`name==version`, got {raw!r}")
    if python is None or not platforms:
        raise BundleError(f"{path} names no `python X.Y.Z` or no `platform TAG ...` line")
    return Image(python, platforms, packages)


def check_needs(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """`CHECK_NEEDS` with this project's version bounds (pyproject.toml's dependencies)."""
    declared = {canonicalize_name(r.name): r for r in map(
        Requirement, tomllib.loads(pyproject.read_text())["project"]["dependencies"])}
    return [declared.get(canonicalize_name(n)) or Requirement(n) for n in CHECK_NEEDS]


def _accepts(req: Requirement, version: Version) -> bool:
    return req.specifier.contains(version, prereleases=True)


def wheel_requires(wheel: Path, image: Image) -> list[Requirement]:
    """A wheel's Requires-Dist that apply on the node (markers evaluated for its Python)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(z.read(name).decode())
    out = []
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(image.markers()):
            out.append(req)
    return out


def _wheels(folder: Path) -> dict[str, Path]:
    return {canonicalize_name(parse_wheel_filename(p.name)[0]): p
            for p in sorted(Path(folder).glob("*.whl"))}


def _fetch(name: str, version: str, out: Path, image: Image, python: str) -> Path:
    """The wheel of name==version for the node, into `out` (pip's cache serves a repeat)."""
    pin = f"{name}=={version}"
    if name in SOURCE_ONLY:
        command = [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                   pin]
    else:
        platforms = [a for tag in image.platforms for a in ("--platform", tag)]
        command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--dest", str(out), "--python-version", image.python_short, *platforms,
                   "--platform", "any", pin]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BundleError(f"no wheel of {pin} for Python {image.python_short} on "
                          f"{' '.join(image.platforms)}:\n{proc.stderr[-2000:]}")
    wheel = _wheels(out).get(name)
    if wheel is None:
        raise BundleError(f"pip fetched {pin} but no wheel of it is in {out}")
    return wheel


def build(out: Path, image: Image, needs: list[Requirement], python: str = sys.executable,
          env_version=importlib.metadata.version) -> list[Path]:
    """Fill `out` with the wheels the node lacks (see the module docstring); return them."""
    out.mkdir(parents=True, exist_ok=True)
    carried: dict[str, Path] = {}
    queue = list(needs)
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in image.packages and _accepts(req, image.packages[name]):
            continue  # the image has it at a version the requirement accepts
        if name in carried:
            version = parse_wheel_filename(carried[name].name)[1]
            if not _accepts(req, version):
                raise BundleError(f"{req} (needed on the node) refuses the carried {name} "
                                  f"{version}")
            continue
        try:
            version = Version(env_version(name))
        except importlib.metadata.PackageNotFoundError:
            raise BundleError(f"{name} (needed on the node: {req}) is not installed in "
                              f"{python}'s environment; install the project's environment first "
                              "(make venv)") from None
        if not _accepts(req, version):
            raise BundleError(f"this environment has {name} {version}, which {req} (needed on "
                              "the node) refuses")
        wheel = _wheels(out).get(name)
        if wheel is None or parse_wheel_filename(wheel.name)[1] != version:
            wheel = _fetch(name, str(version), out, image, python)
        carried[name] = wheel
        queue.extend(wheel_requires(wheel, image))
    return sorted(carried.values())


def _stand_in(name: str, version: Version, folder: Path) -> None:
    """An empty wheel that says `name` `version` is installed: the image's package for pip."""
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: repgeom\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


def verify(out: Path, image: Image, needs: list[Requirement],
           python: str = sys.executable, limit_mib: float = LIMIT_MIB) -> list[str]:
    """Check the bundle in `out` (see the module docstring); raise BundleError, or return the
    lines that say what was checked."""
    wheels = sorted(Path(out).glob("*.whl"))
    if not wheels:
        raise BundleError(f"no wheel in {out}: build it first (bash benchmarks/gpu_wheels.sh)")
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    if mib > limit_mib:
        largest = ", ".join(f"{w.name} {w.stat().st_size / 2**20:.1f} MiB" for w in sorted(
            wheels, key=lambda w: -w.stat().st_size)[:3])
        raise BundleError(f"the bundle in {out} is {mib:.1f} MiB, over the {limit_mib} MiB it "
                          f"may take to the node (largest: {largest})")
    # Every requirement on a package (the check's, and each carried wheel's), for the
    # "carried though the image has it" test.
    asked: dict[str, list[Requirement]] = {}
    for req in [*needs, *(r for w in wheels for r in _safe_requires(w, image))]:
        asked.setdefault(canonicalize_name(req.name), []).append(req)
    for wheel in wheels:
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        have = image.packages.get(name)
        if have is not None and all(_accepts(r, have) for r in asked.get(name, [])):
            raise BundleError(f"{wheel.name} is carried, but the image has {name} {have}, "
                              "which every requirement accepts: remove it from the bundle "
                              "(the node would load it over the image's own)")
    with tempfile.TemporaryDirectory(prefix="gpu_bundle_") as tmp:
        tmp = Path(tmp)
        (tmp / "image").mkdir()
        for name, version in image.packages.items():
            _stand_in(name, version, tmp / "image")
        platforms = [a for tag in image.platforms for a in ("--platform", tag)]
        command = [python, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                   "--no-index", "--find-links", str(Path(out).resolve()), "--find-links",
                   str(tmp / "image"), "--target", str(tmp / "site"), "--python-version",
                   image.python_short, *platforms, "--platform", "any", "--only-binary=:all:",
                   "--report", str(tmp / "report.json"), *map(str, needs), *map(str, wheels)]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BundleError(f"the bundle does not install on the node's Python "
                              f"{image.python} ({' '.join(image.platforms)}); pip says:\n"
                              + "\n".join(proc.stderr.strip().splitlines()[-15:]))
        report = json.loads((tmp / "report.json").read_text())
    installed = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                 for i in report["install"]}
    carried = sorted(canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels)
    from_image = sorted(set(installed) - set(carried))
    return [f"bundle {out}: {len(wheels)} wheels, {mib:.1f} MiB (limit {limit_mib} MiB): "
            + ", ".join(f"{n} {installed[n]}" for n in carried),
            f"dry run for Python {image.python} ({image.platforms[0]}), no index: the check's "
            f"{len(needs)} needs resolve, with {len(from_image)} packages from the image record "
            f"({', '.join(from_image)})"]


def _safe_requires(wheel: Path, image: Image) -> list[Requirement]:
    try:
        return wheel_requires(wheel, image)
    except (zipfile.BadZipFile, StopIteration):  # not a wheel: the dry run names it
        return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "verify"))
    parser.add_argument("out", type=Path, help="the bundle's folder (.whl by default in scripts)")
    parser.add_argument("--image", type=Path, default=IMAGE)
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    args = parser.parse_args()
    try:
        image, needs = read_image(args.image), check_needs()
        if args.action == "build":
            wheels = build(args.out, image, needs)
            print(f"gpu_bundle: {len(wheels)} wheels for Python {image.python_short} into "
                  f"{args.out}: {', '.join(w.name for w in wheels)}")
        else:
            for line in verify(args.out, image, needs, limit_mib=args.limit_mib):
                print(line)
    except BundleError as error:
        raise SystemExit(f"gpu_bundle.py {args.action}: {error}") from None


if __name__ == "__main__":
    main()
