"""`benchmarks/work_folder.claim`: a benchmark deletes inside a work folder only when it made it;
a folder the user named that holds their files is refused and left as it was."""

import importlib.util
from pathlib import Path

import pytest
from hydra_configs import ROOT

_spec = importlib.util.spec_from_file_location("work_folder",
                                               ROOT / "benchmarks" / "work_folder.py")
work_folder = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(work_folder)


def test_a_users_folder_is_refused_and_untouched(tmp_path: Path) -> None:
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "before").mkdir()
    (mine / "before" / "thesis.tex").write_text("my work")
    with pytest.raises(SystemExit, match="already holds files that this benchmark did not make"):
        work_folder.claim(mine, "bench_x.py")
    assert (mine / "before" / "thesis.tex").read_text() == "my work"
    assert not (mine / work_folder.MARKER).exists()


def test_a_new_or_empty_folder_is_claimed_and_claimed_again(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (tmp_path / "new" / "work", empty):
        claimed = work_folder.claim(folder, "bench_x.py")
        assert claimed == folder.resolve() and (claimed / work_folder.MARKER).is_file()
        (claimed / "out").mkdir()  # the benchmark's own runs, then a rerun
        assert work_folder.claim(folder, "bench_x.py") == claimed
