"""benchmarks/gpu_bundle.py: the GPU node's wheel bundle is refused when a wheel does not fit the
node's Python, when it carries what the image has, and when it is over its size limit (issue 41).

No network: the bundles here are stand-in wheels (metadata only), resolved with `--no-index`."""

import sys
import zipfile
from pathlib import Path

import pytest
from cli_runs import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_bundle  # noqa: E402
from gpu_bundle import BundleError, _stand_in, check_needs, read_image, verify  # noqa: E402
from packaging.version import Version  # noqa: E402

# What the image record lacks of the check's needs, as stand-ins of the versions built today.
LACKED = {"hydra-core": "1.3.8", "omegaconf": "2.3.1", "faiss-cpu": "1.15.1"}


def _bundle(folder: Path) -> Path:
    folder.mkdir()
    for name, version in LACKED.items():
        _stand_in(name, Version(version), folder)
    return folder


def _retag(wheel: Path, tag: str) -> Path:
    """The same wheel under another tag (file name and WHEEL file), as pip would see it."""
    name, version = wheel.name.split("-")[:2]
    target = wheel.with_name(f"{name}-{version}-{tag}.whl")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.namelist():
            data = src.read(item)
            if item.endswith("/WHEEL"):
                data = data.replace(b"Tag: py3-none-any", f"Tag: {tag}".encode())
            dst.writestr(item, data)
    wheel.unlink()
    return target


def test_the_image_record_names_the_node_python_and_the_stated_packages() -> None:
    image = read_image()
    assert image.python == "3.12.3" and image.python_short == "3.12"
    assert image.packages["torch"] == Version("2.11.0+cu130")
    assert image.packages["lightning"] == Version("2.6.6")
    assert image.packages["transformers"] == Version("5.17.0")
    assert "regex" in image.packages


def test_a_bundle_of_what_the_image_lacks_resolves_for_the_node(tmp_path: Path) -> None:
    lines = verify(_bundle(tmp_path / "bundle"), read_image(), check_needs())
    assert "3 wheels" in lines[0] and "faiss-cpu 1.15.1" in lines[0]
    assert "Python 3.12.3" in lines[1] and "torch" in lines[1]


def test_a_bundle_missing_a_needed_package_fails_the_dry_run(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    (bundle / "omegaconf-2.3.1-py3-none-any.whl").unlink()
    with pytest.raises(BundleError, match="(?s)does not install.*omegaconf>=2.3"):
        verify(bundle, read_image(), check_needs())


def test_a_cp311_wheel_fails_the_rehearsal_for_a_python_312_node(tmp_path: Path) -> None:
    # issue 41: gpu_wheels.sh built for Python 3.11, and `pip install --target --no-index` on
    # the node's 3.12 aborted the whole install on the one cp311 wheel
    bundle = _bundle(tmp_path / "bundle")
    wheel = _retag(next(bundle.glob("faiss_cpu-*.whl")), "cp311-cp311-manylinux2014_x86_64")
    with pytest.raises(BundleError, match="does not install on the node's Python 3.12.3") as e:
        verify(bundle, read_image(), check_needs())
    assert wheel.name in str(e.value)  # pip names the wheel
    # the same wheel tagged for 3.12 is taken
    _retag(wheel, "cp312-cp312-manylinux2014_x86_64")
    verify(bundle, read_image(), check_needs())


def test_a_wheel_of_a_package_the_image_has_at_an_accepted_version_is_refused(
        tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    _stand_in("regex", Version("2026.11.19"), bundle)  # the image has regex, any version will do
    with pytest.raises(BundleError, match="regex-2026.11.19.*image has regex"):
        verify(bundle, read_image(), check_needs())


def test_a_package_the_image_has_at_a_refused_version_is_carried(tmp_path: Path) -> None:
    image = read_image()
    image.packages["numpy"] = Version("1.24.0")  # this project needs numpy>=1.26
    bundle = _bundle(tmp_path / "bundle")
    with pytest.raises(BundleError, match="does not install"):
        verify(bundle, image, check_needs())
    _stand_in("numpy", Version("2.4.6"), bundle)
    assert "numpy 2.4.6" in verify(bundle, image, check_needs())[0]


def test_a_bundle_over_the_limit_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    with open(bundle / "faiss_cpu-1.15.1-py3-none-any.whl", "r+b") as f:
        f.truncate(41 * 2**20)  # sparse: a 41 MiB file that takes no disk
    with pytest.raises(BundleError, match=r"41.\d MiB, over the 40 MiB"):
        verify(bundle, read_image(), check_needs())
    assert gpu_bundle.LIMIT_MIB == 40


def test_build_carries_only_what_the_image_lacks(tmp_path: Path, monkeypatch) -> None:
    fetched = []

    def fetch(name, version, out, image, python):
        fetched.append(name)
        _stand_in(name, Version(version), out)
        return next(out.glob(f"{name.replace('-', '_')}-*.whl"))

    monkeypatch.setattr(gpu_bundle, "_fetch", fetch)
    versions = {"hydra-core": "1.3.8", "omegaconf": "2.3.1", "faiss-cpu": "1.15.1"}
    wheels = gpu_bundle.build(tmp_path / "out", read_image(), check_needs(),
                              env_version=versions.__getitem__)
    assert sorted(fetched) == sorted(versions)
    assert len(wheels) == 3


def test_the_rehearsal_stops_on_a_cp311_wheel_before_the_check_runs(tmp_path: Path) -> None:
    # The whole `gpu_check.sh --rehearse`: the bundle's wheels are already there (stand-ins at
    # this environment's versions, so the build fetches nothing), one of them tagged for 3.11.
    import importlib.metadata
    import subprocess

    from cli_runs import PYTHON, subprocess_env

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name in LACKED:
        _stand_in(name, Version(importlib.metadata.version(name)), bundle)
    wheel = _retag(next(bundle.glob("faiss_cpu-*.whl")), "cp311-cp311-manylinux2014_x86_64")
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--rehearse"], cwd=ROOT,
                          env=subprocess_env(PYTHON=PYTHON, GPU_CHECK_WHEELS=str(bundle),
                                             GPU_CHECK_RESULTS=str(tmp_path / "results.txt")),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "does not install on the node's Python 3.12.3" in proc.stderr
    assert wheel.name in proc.stderr
    assert "repgeom GPU check" not in proc.stdout  # no stage ran
    assert not (tmp_path / "results.txt").exists()
