"""Download, verification and reading of local copies, against a server on 127.0.0.1."""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import zipfile
from pathlib import Path

import pytest

from repgeom.data import enwik8
from repgeom.data.enwik8 import DataError, SourceSpec

SMALL = b"<mediawiki>" + bytes(range(256)) * 40 + b"</mediawiki>"  # ~10 kB stand-in for enwik8


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _zip(data: bytes, member: str = "enwik8") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
    return buf.getvalue()


SMALL_ZIP = _zip(SMALL)
SMALL_SPEC = SourceSpec("enwik8", _sha(SMALL), len(SMALL))


def test_download_success(http_server, tmp_path: Path) -> None:
    http_server.files["/enwik8.zip"] = SMALL_ZIP
    dest = tmp_path / "cache" / "enwik8.zip"
    out = enwik8.download(
        http_server.url + "/enwik8.zip", dest, sha256=_sha(SMALL_ZIP), size=len(SMALL_ZIP)
    )
    assert out == dest and dest.read_bytes() == SMALL_ZIP
    assert [p.name for p in dest.parent.iterdir()] == ["enwik8.zip"]  # no temp file left


def test_download_checksum_mismatch_leaves_nothing(http_server, tmp_path: Path) -> None:
    http_server.files["/enwik8.zip"] = SMALL_ZIP
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as e:
        enwik8.download(http_server.url + "/enwik8.zip", cache / "enwik8.zip", sha256="0" * 64)
    msg = str(e.value)
    assert "expected " + "0" * 64 in msg and "found " + _sha(SMALL_ZIP) in msg
    assert "nothing was kept" in msg
    assert list(cache.iterdir()) == []


def test_download_truncated_body_leaves_nothing(http_server, tmp_path: Path) -> None:
    http_server.files["/enwik8.zip"] = SMALL_ZIP
    http_server.truncate.add("/enwik8.zip")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="truncated"):
        enwik8.download(http_server.url + "/enwik8.zip", cache / "enwik8.zip", sha256=None)
    assert list(cache.iterdir()) == []


def test_download_http_error_leaves_nothing(http_server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="404") as e:
        enwik8.download(http_server.url + "/missing.zip", cache / "enwik8.zip", sha256=None)
    assert "data.path" in str(e.value)  # says how to proceed without the network
    assert list(cache.iterdir()) == []


def test_load_raw_downloads_once_then_reads_the_cache(http_server, tmp_path: Path) -> None:
    http_server.files["/enwik8.zip"] = SMALL_ZIP
    kwargs = dict(
        cache_dir=tmp_path,
        url=http_server.url + "/enwik8.zip",
        zip_sha256=_sha(SMALL_ZIP),
        zip_size=len(SMALL_ZIP),
        spec=SMALL_SPEC,
    )
    data, sha = enwik8.load_raw("enwik8", **kwargs)
    assert data == SMALL and sha == SMALL_SPEC.sha256
    data2, _ = enwik8.load_raw("enwik8", **kwargs)
    assert data2 == SMALL and http_server.requests == ["/enwik8.zip"]


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_truncated_zip_path_is_refused(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "enwik8.zip"
    path.write_bytes(SMALL_ZIP[: int(len(SMALL_ZIP) * cut)])
    with pytest.raises(DataError, match="truncated or corrupt archive") as e:
        enwik8.read_local(path, spec=SMALL_SPEC)
    assert str(path) in str(e.value) and "Delete" in str(e.value)


def test_corrupt_zip_member_is_refused(tmp_path: Path) -> None:
    # Flip a byte inside the compressed data: the central directory is intact, the CRC is not.
    z = bytearray(SMALL_ZIP)
    z[60] ^= 0xFF
    path = tmp_path / "enwik8.zip"
    path.write_bytes(bytes(z))
    with pytest.raises(DataError, match="truncated or corrupt archive"):
        enwik8.read_local(path, spec=SMALL_SPEC)


def test_truncated_gzip_is_refused(tmp_path: Path) -> None:
    gz = gzip.compress(SMALL)
    path = tmp_path / "sample.gz"
    path.write_bytes(gz[: len(gz) // 2])
    with pytest.raises(DataError, match="truncated or corrupt archive"):
        enwik8.read_local(path, spec=SMALL_SPEC)


@pytest.mark.parametrize("kind", ["raw", "zip", "gz"])
def test_read_local_formats(tmp_path: Path, kind: str) -> None:
    blob = {"raw": SMALL, "zip": _zip(SMALL, member="anything"), "gz": gzip.compress(SMALL)}[kind]
    path = tmp_path / f"copy.{kind}"
    path.write_bytes(blob)
    assert enwik8.read_local(path, spec=SMALL_SPEC) == (SMALL, SMALL_SPEC.sha256)


def test_wrong_file_is_refused_with_expected_found_and_remedy(tmp_path: Path) -> None:
    path = tmp_path / "enwik8"
    path.write_bytes(SMALL[:-1])
    with pytest.raises(DataError) as e:
        enwik8.read_local(path, spec=SMALL_SPEC)
    msg = str(e.value)
    assert str(path) in msg
    assert f"expected {len(SMALL):,} bytes, found {len(SMALL) - 1:,}" in msg
    assert f"expected {SMALL_SPEC.sha256}, found {_sha(SMALL[:-1])}" in msg
    assert "data.verify=false" in msg


def test_verify_false_accepts_with_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "other"
    path.write_bytes(b"x" * 100)
    with caplog.at_level(logging.WARNING, logger="repgeom.data.enwik8"):
        data, sha = enwik8.read_local(path, spec=SMALL_SPEC, verify=False)
    assert data == b"x" * 100 and sha == _sha(data)
    assert "verify=False" in caplog.text


def test_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        enwik8.read_local(tmp_path / "nope.zip", spec=SMALL_SPEC)


def test_bundled_sample_matches_its_provenance() -> None:
    assert enwik8.sha256_file(enwik8.SAMPLE_PATH) == enwik8.SAMPLE_GZ_SHA256
    assert enwik8.SAMPLE_PATH.stat().st_size == enwik8.SAMPLE_GZ_SIZE
    data, sha = enwik8.load_raw("sample")
    assert len(data) == enwik8.SAMPLE_SIZE and sha == enwik8.SAMPLE_SHA256
    assert data.startswith(b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/"')


def test_split_sizes_full_enwik8_is_90M_5M_5M() -> None:
    assert enwik8.split_sizes(100_000_000) == (90_000_000, 5_000_000, 5_000_000)


@pytest.mark.parametrize("n", [enwik8.SAMPLE_SIZE, 20, 1001, 12_345_679])
def test_split_sizes_are_proportional(n: int) -> None:
    n_train, n_val, n_test = enwik8.split_sizes(n)
    assert n_train + n_val + n_test == n
    assert n_train == n * 9 // 10 and n_val == n // 20
    assert abs(n_test - n / 20) <= 2  # floor rounding of the other two goes to the test split


def test_split_is_a_partition_in_order() -> None:
    data = bytes(range(256)) * 4
    parts = enwik8.split(data)
    assert b"".join(parts) == data
    assert tuple(map(len, parts)) == enwik8.split_sizes(len(data))


def test_default_cache_dir_honours_env(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REPGEOM_DATA", str(tmp_path))
    assert enwik8.default_cache_dir() == tmp_path
    monkeypatch.delenv("REPGEOM_DATA")
    assert enwik8.default_cache_dir() == enwik8.PROJECT_ROOT / "data" / "cache"
