"""The trajectory's prefetch thread (`repgeom.probes.run.prefetch.Prefetch`); Ctrl-C during a
download is tested against the stand-in hub in tests/models/hub/test_downloads.py."""

import time

import pytest

from repgeom.probes.run.prefetch import Prefetch


def test_the_wait_for_a_fetch_hands_on_its_result_or_its_own_timeout_error() -> None:
    """`Prefetch.result` waits in slices; a fetch that raises TimeoutError (a socket timeout
    is one) is its answer, not a slice ending: it is raised, not waited for again."""
    def slow() -> str:
        time.sleep(0.6)  # several slices of 0.25 s
        return "files"

    def timed_out() -> None:
        raise TimeoutError("read timed out")

    with Prefetch() as pool:
        assert Prefetch.result(pool.submit(slow)) == "files"
        failing = pool.submit(timed_out)
        with pytest.raises(TimeoutError, match="read timed out"):
            Prefetch.result(failing)
