"""Probe tables before and after a change: are they bit-identical? (issue 26, the layout change)

Builds the "before" tree from a commit with ``git archive`` and runs the same eight ``probe.py``
commands with each tree (that tree's ``src`` on ``PYTHONPATH``, its folder as the working
directory, each output in its own folder), on the same inputs, made once here with this tree:

1-3. tiny random GPT-2, BERT and T5 (tests/tiny_hf_models.py), ``hf=<folder> n_states=192``
     (T5 is probed as two models, encoder and decoder: two tables, compared one by one);
4.   the tiny GPT-2 on a text file, ``positions_per_window=all seed=3``;
5-6. ``ckpt=`` on the last checkpoint of a 60-step quickstart run (trained once, with this tree),
     without and with ``text_file=``;
     (4 and 6 with ``settings.state_batch_size=64 settings.max_order=16``: three batches, so
     the ID rows' std is a number too; with one batch of 192 it is NaN);
7.   ``run=`` over that run's checkpoints (every step and the vs-final pairwise rows);
8.   an ``hf_revisions`` trajectory of three revisions of a tiny Pythia (gpt_neox) served by the
     tests' hub stand-in (tests/hub_server.py ``FakeHub``; ``HF_ENDPOINT`` its url, a fresh
     ``HF_HOME`` per run, ``HF_HUB_OFFLINE`` unset).

One line per configuration: the rows compared, the columns common to both tables, the columns
only before or only after, the rows only in one of them (by metric), the largest relative
difference over the common float columns (NaN equal to NaN) and IDENTICAL or DIFFERENT.
IDENTICAL means every common row's every common column equal, no row only before, and any row
only after from a metric the before tree does not have (``--new-metrics``, default the
rows of the new id_scales entry: ``twonn_dec<j>``, ``twonn_dec<j>_scale``, ``gride_k<k>_scale``,
``id_plateau``, ``id_plateau_lo``, ``id_plateau_hi``, and ``copy_share``, the copies guard's
reading, a new row of the intrinsic-dimension entry); rows only after of any other metric make
it DIFFERENT. With ``--rtol r`` a table whose float columns differ but stay within
``|before - after| <= r * |after|`` (numpy.isclose, atol 0) is "EQUAL within rtol r" instead:
for a change that moves the last bits, such as issue 34's effective rank and RankMe from the
Gram matrix, ``--rtol 1e-6``.

    python benchmarks/bench_tables_identical.py --before 26b6f28
    python benchmarks/bench_tables_identical.py --before 2235cd6 --rtol 1e-6
    python benchmarks/bench_tables_identical.py --before 26b6f28 --only gpt2 trajectory

Both trees run on one thread (``OMP_NUM_THREADS=1``) on the CPU, one command at a time. The
work folder (``--work``, default /tmp/ident) keeps the models, the checkpoint run and every
output; a rerun reuses the models and the run, and runs the probes again. It must be new, empty
or one this script made (`work_folder.claim`): outputs inside it are deleted and made again.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from work_folder import claim  # benchmarks/, beside this script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

N_STATES = 192
REPO = "check/pythia-tiny"
REVISIONS = ("step1000", "step2000", "step4000")
KEY_ORDER = ("model", "revision", "run", "run_b", "step", "step_b", "layer", "layer_b",
             "layer_name", "head", "metric")
NEW_METRICS = r"twonn_dec\d+(_scale)?|gride_k\d+_scale|id_plateau(_lo|_hi)?|copy_share"
"""Rows new after 26b6f28: the id_scales catalogue entry (metrics=[all] includes it) and the
intrinsic-dimension entry's ``copy_share`` (the share of copies the copy guard reads)."""

CONFIGS: dict[str, str] = {
    "gpt2": "1. tiny GPT-2, hf=<folder> n_states=192",
    "bert": "2. tiny BERT, hf=<folder> n_states=192",
    "t5": "3. tiny T5 (encoder, decoder), hf=<folder> n_states=192",
    "gpt2_text_all": "4. tiny GPT-2, text_file= positions_per_window=all seed=3 (batches of 64)",
    "ckpt": "5. ckpt= quickstart 60 steps",
    "ckpt_text": "6. ckpt= quickstart 60 steps, text_file= (batches of 64)",
    "run": "7. run= quickstart 60 steps (every checkpoint, vs-final rows)",
    "trajectory": "8. hf_revisions=[step1000,step2000,step4000] from the hub stand-in",
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="offline",
               TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def make_before(rev: str, dest: Path) -> str:
    """``git archive`` of `rev` into `dest` (reused when it holds that commit already)."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, text=True,
                            capture_output=True).stdout.strip()
    stamp = dest / ".archived_commit"
    if stamp.exists() and stamp.read_text().strip() == commit:
        return commit
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    stamp.write_text(commit + "\n")
    return commit


def make_inputs(work: Path) -> dict[str, Path]:
    """The tiny models, the text file and the 60-step quickstart run, each made once."""
    from tiny_hf_models import TEXT, build_tiny_hf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    models = work / "models"
    paths: dict[str, Path] = {}
    for family in ("gpt2", "bert", "t5", "gpt_neox"):
        folder = models / family
        if not (folder / "config.json").exists():
            build_tiny_hf(family, folder)
        paths[family] = folder
    # Three Pythia revisions with different weights: the family's model, then two redrawn ones.
    for i, rev in enumerate(REVISIONS):
        folder = models / f"pythia_{rev}"
        if not (folder / "config.json").exists():
            import torch
            from transformers import AutoModel

            shutil.copytree(paths["gpt_neox"], folder)
            if i:
                model = AutoModel.from_pretrained(folder)
                torch.manual_seed(i)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p), alpha=0.1 * i)
                model.save_pretrained(folder)
        paths[rev] = folder
    text = work / "text.txt"
    if not text.exists():
        text.write_text(TEXT * 8, encoding="utf-8")
    paths["text"] = text

    qs = work / "qs"
    if not (qs / "checkpoints" / "last.ckpt").exists():
        command = [sys.executable, "train.py", "experiment=quickstart", "trainer.max_steps=60",
                   "logger=csv", "callbacks=trajectory",
                   "callbacks.checkpoint_every.every_n_train_steps=20",
                   "trainer.val_check_interval=60", f"hydra.run.dir={qs}"]
        done = subprocess.run(command, cwd=ROOT, env=_env(PYTHONPATH=str(ROOT / "src")),
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"training the quickstart run failed:\n{done.stderr[-3000:]}")
    paths["qs"] = qs
    return paths


def commands(paths: dict[str, Path]) -> dict[str, list[str]]:
    """Each configuration's probe.py overrides (the same spelling in both versions: no option
    these use was renamed between 26b6f28 and the layout change)."""
    common = [f"n_states={N_STATES}", "plot_metrics=[]", "device=cpu"]
    # 192 states are one batch of the ID estimators, whose std is then NaN: three batches of 64
    # in configurations 4 and 6 give every ID row a std across batches to compare as well (GRIDE
    # up to order 16: order 64 needs more than 64 distinct states per batch).
    batches = ["settings.state_batch_size=64", "settings.max_order=16"]
    return {
        "gpt2": [f"hf={paths['gpt2']}", *common],
        "bert": [f"hf={paths['bert']}", *common],
        "t5": [f"hf={paths['t5']}", *common],
        "gpt2_text_all": [f"hf={paths['gpt2']}", f"text_file={paths['text']}",
                          "positions_per_window=all", "seed=3", *batches, *common],
        "ckpt": [f"ckpt={paths['qs'] / 'checkpoints' / 'last.ckpt'}", *common],
        "ckpt_text": [f"ckpt={paths['qs'] / 'checkpoints' / 'last.ckpt'}",
                      f"text_file={paths['text']}", *batches, *common],
        "run": [f"run={paths['qs']}", *common],
        "trajectory": [f"hf={REPO}", f"hf_revisions=[{','.join(REVISIONS)}]", *common],
    }


def run_probe(tree: Path, args: list[str], out: Path, env: dict[str, str]) -> float:
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "probe.py", *args, f"hydra.run.dir={out}"],
                          cwd=tree, env={**env, "PYTHONPATH": str(tree / "src")},
                          capture_output=True, text=True)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"probe.py failed in {tree} ({out.name}.log):\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def tables(out: Path) -> dict[str, pd.DataFrame]:
    """Every probes table under `out`, by its folder relative to `out` (one per model stack)."""
    found = {}
    for path in sorted(out.rglob("probes.parquet")):
        found[str(path.parent.relative_to(out))] = pd.read_parquet(path)
    if not found:
        for path in sorted(out.rglob("probes.csv")):
            found[str(path.parent.relative_to(out))] = pd.read_csv(path)
    return found


def _equal(a: pd.Series, b: pd.Series) -> np.ndarray:
    a, b = a.to_numpy(), b.to_numpy()
    same = np.array([x == y for x, y in zip(a, b, strict=True)], dtype=bool)
    nan = np.array([_isnan(x) and _isnan(y) for x, y in zip(a, b, strict=True)], dtype=bool)
    return same | nan


def _isnan(x) -> bool:
    return x is None or (isinstance(x, float) and np.isnan(x)) or x is pd.NA


def compare(before: pd.DataFrame, after: pd.DataFrame, new_metrics: str,
            rtol: float = 0.0) -> dict:
    common = [c for c in before.columns if c in after.columns]
    only_before = [c for c in before.columns if c not in after.columns]
    only_after = [c for c in after.columns if c not in before.columns]
    keys = [c for c in KEY_ORDER if c in common]
    b = before[common].copy()
    a = after[common].copy()
    for frame in (a, b):
        for k in keys:  # one spelling of "none" in the key columns (NaN/None/"")
            if frame[k].dtype == object:
                frame[k] = frame[k].fillna("").astype(str)
    dup = int(b.duplicated(keys).sum() + a.duplicated(keys).sum())
    merged = b.merge(a, on=keys, how="outer", suffixes=("_before", "_after"), indicator=True)
    rows_before_only = merged[merged["_merge"] == "left_only"]
    rows_after_only = merged[merged["_merge"] == "right_only"]
    both = merged[merged["_merge"] == "both"]
    unequal_cols, beyond_rtol, largest = [], [], 0.0
    for col in (c for c in common if c not in keys):
        x, y = both[f"{col}_before"], both[f"{col}_after"]
        equal = _equal(x, y)
        if not equal.all():
            unequal_cols.append(col)
            numeric = pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y)
            if not numeric or not np.all(
                    equal | np.isclose(x.to_numpy(float), y.to_numpy(float), rtol=rtol, atol=0)):
                beyond_rtol.append(col)
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            xv, yv = x.to_numpy(float), y.to_numpy(float)
            finite = np.isfinite(xv) & np.isfinite(yv)
            scale = np.maximum(np.abs(xv[finite]), np.abs(yv[finite]))
            diff = np.abs(xv[finite] - yv[finite])
            rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1), 0.0)
            if rel.size:
                largest = max(largest, float(rel.max()))
            if (np.isnan(xv) != np.isnan(yv)).any():
                largest = float("inf")
    new = rows_after_only["metric"].astype(str).str.fullmatch(new_metrics) \
        if "metric" in keys else pd.Series(False, index=rows_after_only.index)
    same_rows = rows_before_only.empty and bool(new.all()) and dup == 0 and not both.empty
    identical = same_rows and not unequal_cols
    return dict(
        rows=len(both), rows_before=len(before), rows_after=len(after), common=common,
        only_before=only_before, only_after=only_after, unequal=unequal_cols, dup=dup,
        before_only_metrics=sorted(rows_before_only["metric"].astype(str).unique())
        if "metric" in keys else [],
        after_only_metrics=sorted(rows_after_only["metric"].astype(str).unique())
        if "metric" in keys else [],
        after_only_rows=len(rows_after_only), before_only_rows=len(rows_before_only),
        largest=largest, identical=identical, within_rtol=same_rows and not beyond_rtol,
    )


def _metric_families(names: list[str]) -> str:
    """`twonn_dec0, twonn_dec1, ...` -> `twonn_dec*`: a short list for one line."""
    stems = sorted({re.sub(r"\d+", "*", n) for n in names})
    return ",".join(stems)


def verdict(r: dict, rtol: float) -> str:
    if r["identical"]:
        return "IDENTICAL"
    return f"EQUAL within rtol {rtol:g}" if rtol > 0 and r["within_rtol"] else "DIFFERENT"


def line(name: str, part: str, r: dict, rtol: float) -> str:
    label = CONFIGS[name].split(".")[0] + ". " + (name if part in (".", "probes")
                                                  else f"{name}[{part}]")
    extra = (f"; rows only after: {r['after_only_rows']} "
             f"({_metric_families(r['after_only_metrics'])})" if r["after_only_rows"] else "")
    if r["before_only_rows"]:
        extra += (f"; rows only before: {r['before_only_rows']} "
                  f"({_metric_families(r['before_only_metrics'])})")
    if r["unequal"]:
        extra += f"; unequal columns: {','.join(r['unequal'])}"
    if r["dup"]:
        extra += f"; {r['dup']} duplicate keys"
    return (f"{label}: {r['rows']} rows compared (before {r['rows_before']}, after "
            f"{r['rows_after']}), {len(r['common'])} common columns, only before "
            f"[{','.join(r['only_before'])}], only after [{','.join(r['only_after'])}]{extra}; "
            f"largest relative difference {r['largest']:.3g}: "
            f"{verdict(r, rtol)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="26b6f28", help="commit of the 'before' tree")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ident"))
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--new-metrics", default=NEW_METRICS,
                        help="regex of metrics that may appear only after (new rows)")
    parser.add_argument("--rtol", type=float, default=0.0,
                        help="accept float columns within this relative tolerance, |a - b| <= "
                             "rtol * |b| (numpy.isclose, atol 0); 0 (default): bit for bit")
    args = parser.parse_args()
    work = claim(args.work, "bench_tables_identical.py")  # what it deletes inside is its own
    commit = make_before(args.before, work / "before")
    after_head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                                text=True, capture_output=True).stdout.strip()
    print(f"before: {commit[:7]} (git archive in {work / 'before'}); after: this tree "
          f"({after_head}); python {sys.version.split()[0]}, one thread, CPU", flush=True)
    paths = make_inputs(work)
    trees = {"before": work / "before", "after": ROOT}
    cmds = commands(paths)
    from hub_server import FakeHub

    all_identical = all_within = True
    served = {rev: paths[rev] for rev in REVISIONS}
    with FakeHub(REPO, served) as hub:
        for name in args.only:
            walls = {}
            for version, tree in trees.items():
                env = _env(HF_HOME=str(work / "hf_home" / version / name))
                if name == "trajectory":
                    env["HF_ENDPOINT"] = hub.url
                else:
                    env["HF_HUB_OFFLINE"] = "1"
                walls[version] = run_probe(tree, cmds[name], work / "out" / version / name, env)
            found = {v: tables(work / "out" / v / name) for v in trees}
            parts = sorted(set(found["before"]) | set(found["after"]))
            for part in parts:
                if part not in found["before"] or part not in found["after"]:
                    where = "after" if part in found["after"] else "before"
                    print(f"{name}[{part}]: a table only {where}: DIFFERENT", flush=True)
                    all_identical = all_within = False
                    continue
                r = compare(found["before"][part], found["after"][part], args.new_metrics,
                            args.rtol)
                all_identical &= r["identical"]
                all_within &= r["within_rtol"]
                print(line(name, part, r, args.rtol) + f" ({walls['before']:.0f} s / "
                      f"{walls['after']:.0f} s)", flush=True)
    if all_identical:
        print("all IDENTICAL")
    elif args.rtol > 0 and all_within:
        print(f"all EQUAL within rtol {args.rtol:g}")
    else:
        print("some DIFFERENT")
    sys.exit(0 if all_identical or (args.rtol > 0 and all_within) else 1)


if __name__ == "__main__":
    main()
