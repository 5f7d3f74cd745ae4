"""`probe(job)`: the geometry probes on saved checkpoints, whole runs and Hugging Face models.

The engine behind ``probe.py`` (config ``conf/probe.yaml``)::

    python probe.py run=outputs/2026-11-21/12-00-00     # every checkpoint of one of our runs
    python probe.py ckpt=path/to/last.ckpt              # one checkpoint
    python probe.py hf=gpt2                             # a hub name or a save_pretrained folder
    python probe.py hf=EleutherAI/pythia-160m hf_revisions=[step1000,step8000,step143000]
    python probe.py hf=EleutherAI/pythia-160m hf_revisions=all max_revisions=20   # `schedule`
    python probe.py hf=gpt2 compare.text_a="..." compare.text_b="..."
    python probe.py hf=my_model/ tokenizer=gpt2        # a folder saved without its tokenizer
    python probe.py hf=google/byt5-small               # two models: <name>:encoder, :decoder

Every number comes from `repgeom.probes.core.measure.measure`, the function the training probe
(`ProbeCallback`) uses, and lands in the same tidy table (`repgeom.probes.core.table`) through the
same sink (`repgeom.probes.report.sink`). This file only orchestrates: the job (`job.ProbeJob`:
the config read and checked once, by `job.probe_job`), what it names (`sources`: a hub model's
revisions or our checkpoints, as `CheckpointTarget`s or `HFTarget`s, one interface), checkpoint
reading (`checkpoints`), text (`texts`), compare mode (`compare.Comparison`), the probe loop
(`trajectory.Trajectory`), the console (`console`) and similarity across checkpoints
(`similarity`) live in files of their own; nothing here imports the Lightning callback. A
``follow=`` job is the probe worker of a training run (`follow_job`).

Our checkpoints are probed exactly as the training probe did: the probe set is rebuilt with
`sampling.probe_set` from the checkpoint's data (``source``, ``clean`` saved by the datamodule)
and the training probe's config (``n_states``, ``positions_per_window``,
``attention_windows``, ``seed``, settings),
which the callback saves in every checkpoint; for older checkpoints it is read from the run
folder's ``.hydra/config.yaml`` or ``csv/hparams.yaml``. A probe of ``last.ckpt`` therefore
gives the numbers the training probe logged at that step. Values set in ``conf/probe.yaml`` (or
on the command line) win over the training probe's; null means "as the training probe".

The ``step`` column: a checkpoint's ``global_step``; for Hugging Face revisions, the training
step in the revision's name (`repgeom.models.revision_names.step_of`: Pythia's ``step1000`` -> 1000,
OLMo's ``stage1-step140000-tokens294B`` -> 140000; ``main`` after the last named step), or for a
list of names without steps the position in ``hf_revisions`` (0, 1, ...); 0 for one model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from repgeom.console import quiet_console
from repgeom.models.checkpoints import (  # noqa: F401 - the public names of probe.py's engine
    CheckpointFormatError,
    find_checkpoints,
    read_checkpoint,
    resolve_device,
)
from repgeom.models.hf import STACKS
from repgeom.probes.core import table
from repgeom.probes.core.spec import ProbeRequest, resolve, training_probe  # noqa: F401
from repgeom.probes.core.targets import CheckpointTarget, HFTarget
from repgeom.probes.core.texts import default_text  # noqa: F401
from repgeom.probes.report import aggregate, console, phase_report, plots, sink
from repgeom.probes.report.drift_cosine import save_drift_cosine
from repgeom.probes.run import sources
from repgeom.probes.run.compare import Comparison
from repgeom.probes.run.copies import weights_by_revision
from repgeom.probes.run.job import FOLLOW, ProbeJob
from repgeom.probes.run.offload.follow import follow
from repgeom.probes.run.trajectory import Trajectory

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# What gets probed


@dataclass
class ProbeRunResult:
    """What `probe` made: the table, figures and files, for tests and for chaining."""

    output_dir: Path
    frame: pd.DataFrame  # the tidy table (empty in compare mode)
    subjects: list[CheckpointTarget | HFTarget]
    plots: list[Path]
    compare: pd.DataFrame | None = None  # per-layer pooled cosine of the two texts
    drift_cosine: pd.DataFrame | None = None  # Godey et al. 2024 §3.3, per step and model
    warnings: list[str] = field(default_factory=list)
    wandb_dir: Path | None = None
    skipped: list[dict] = field(default_factory=list)  # steps not probed: revision, reason
    copies: dict[str, str] = field(default_factory=dict)  # revision -> whose weights it serves

    @property
    def kinds(self) -> dict[str, str]:
        """Label -> "decoder"/"encoder" of every subject."""
        return {s.label: s.kind for s in self.subjects}


# ---------------------------------------------------------------------------------------------
# The run


def probe(job: ProbeJob, extras: Sequence[Callable[[ProbeJob], list[Path]]] = ()
          ) -> ProbeRunResult:
    """Probe what `job` names (``run``, ``ckpt`` or ``hf``; `job.probe_job` builds it from
    ``conf/probe.yaml``); write the table, plots and logs.

    Returns
    -------
    ProbeRunResult
        The table (``<output_dir>/probes/probes.{parquet,csv}``), figure paths
        (``<output_dir>/probes/plots``), the probed subjects with "encoder"/"decoder", the
        drift-norm/mean-cosine correlation across blocks per step (Godey et al. 2024, §3.3;
        ``<output_dir>/probes/drift_cosine.csv``), and in compare mode the per-layer pooled
        cosine (``<output_dir>/compare/pooled_cosine.csv``).

    `extras` are functions ``(job) -> figure paths`` run after the probe's
    own figures: the analyses a run asks for (``repgeom.analyses.probe_extras``, which
    ``probe.py`` passes; the pipeline does not import the analyses).

    Raises
    ------
    ValueError
        A ``follow=`` job (the probe worker of a training run: `follow_job` runs it); a shard
        that gets no revision or checkpoint.
    """
    if job.mode == FOLLOW:
        raise ValueError("a follow= job is a run's probe worker: run it with `follow_job`")
    quiet_console()
    output_dir = job.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    pairwise = job.pairwise  # the spec resolved once
    subjects = sources.subjects(job, reference_final=pairwise)
    loggers = _wandb_runs(job, subjects)
    if job.compare is not None:
        comparison = Comparison(job.compare, job.device, output_dir,
                                include_special=job.request.include_special)
        pooled = comparison.run(subjects)
        result = ProbeRunResult(output_dir, table.rows_to_frame([]), subjects,
                                comparison.figures, pooled)
    else:  # streamed: bounded disk and memory, resumable (`trajectory`)
        loop = Trajectory(job.request, job.device, output_dir, loggers, work_dir=job.work_dir,
                          keep_weights=job.keep_weights, pairwise=pairwise,
                          stack_dir=_stack_dir, prefix=_wandb_prefix,
                          retry_skipped=job.retry_skipped, retry_budget_s=job.retry_budget_s)
        frame = loop.run(subjects)
        wanted = job.plot_metrics
        figures = save_figures(frame, {s.stack: s.model for s in subjects}, output_dir,
                               None if wanted is None else list(wanted))
        for extra in extras:  # the analyses asked for (repgeom.analyses.probe_extras)
            figures += extra(job)
        console.print_tables(frame, subjects)
        correlation = summarise(frame, output_dir, loggers)
        result = ProbeRunResult(output_dir, frame, subjects, figures, warnings=loop.warnings,
                                drift_cosine=correlation, skipped=list(loop.skipped.values()),
                                copies=dict(loop.copies))
    _write_info(result, job)
    for run in loggers:
        _log_figures(run, result.plots, max(s.step for s in subjects))
        run.summary["probe/kind"] = ", ".join(sorted({s.kind for s in subjects}))
        result.wandb_dir = Path(run.dir).parent
        run.finish()
    print(f"Probe outputs: {output_dir}")
    return result


def follow_job(job: ProbeJob) -> ProbeRunResult:
    """``follow=<run folder>``: the worker of a run trained with ``probe.offload``
    (`repgeom.probes.run.offload.follow`); the table, phases and figures go into that run folder,
    with the training probe's spec (probe.py's own probe options do not apply)."""
    quiet_console()
    result = follow(job.follow, device=job.device, timeout_s=job.follow_timeout_s,
                    keep_snapshots=job.keep_snapshots, lock=job.follow_lock)
    return ProbeRunResult(result.run_dir, result.frame, [], result.plots)


def save_figures(frame: pd.DataFrame, stacks: dict[str | None, str], output_dir: Path,
                 wanted: list[str] | None) -> list[Path]:
    """The figures of a finished table, one model (or stack, ``{stack: model}``) at a time."""
    figures = []
    for stack, model in stacks.items():  # `save_figures` draws one model at a time
        model_rows = frame if stack is None else frame.loc[frame["model"] == model]
        figures += plots.save_figures(
            model_rows, _stack_dir(table.plot_dir(output_dir), stack), metrics=wanted
        )
    return figures


def summarise(frame: pd.DataFrame, output_dir: Path, loggers: list) -> pd.DataFrame:
    """What a finished table adds: the phases (``phases.csv``, console, W&B summary) and Godey et
    al.'s drift/cosine correlation (``drift_cosine.csv``, console), which it returns."""
    phase_report.report(frame, output_dir, loggers)
    correlation = save_drift_cosine(aggregate.single_set(frame), table.probe_dir(output_dir))
    console.print_drift_cosine(correlation)
    return correlation


# -- console, files and W&B -------------------------------------------------------------------


def _wandb_prefix(stack: str | None) -> str:
    """``probe``, or ``probe/<stack>`` for one stack of an encoder-decoder model."""
    return "probe" if stack is None else f"probe/{stack}"


def _stack_dir(folder: Path, stack: str | None) -> Path:
    """Where one stack of an encoder-decoder model keeps its states and figures
    (``probes/encoder/``, ``probes/report/plots/decoder/``); `folder` itself for other models."""
    return folder if stack is None else folder / stack


def _layer_names(frame: pd.DataFrame | None) -> dict[str, dict[str, str]]:
    """{model: {layer index: layer name}} from the table (one entry "" for our checkpoints); the
    rows of the whole model (the LM loss) are no layer (`table.layer_rows`)."""
    if frame is None or frame.empty:
        return {}
    frame = table.layer_rows(frame)
    key = frame["model"] if "model" in frame.columns else pd.Series("", index=frame.index)
    names = frame.assign(_model=key.fillna("")).drop_duplicates(["_model", "layer"])
    return {
        str(model): {str(int(r.layer)): r.layer_name for r in group.itertuples()}
        for model, group in names.sort_values("layer").groupby("_model")
    }


def _write_info(result: ProbeRunResult, job: ProbeJob) -> None:
    """``probe_info.json``: what was probed, encoder or decoder, at which step, and the name of
    every layer index in the table (``embedding``, ``block_<i>``, ``final_norm``)."""
    info = {
        "mode": job.mode,
        # Which protocol made the numbers (conf/protocol/): repgeom or llm_microscope.
        "protocol": job.protocol,
        # The shuffled-text control (texts=shuffled) or the text as it is (texts= unset: as the
        # checkpoint's training probe, which the table's texts column says).
        "texts": job.request.texts or min(
            table.texts_of(result.frame) if result.frame is not None else set(), default="real"),
        "twonn_convention": "llm_microscope" if result.frame is not None and (
            result.frame["metric"] == "twonn_llm_microscope").any() else "facco",
        "compare": result.compare is not None,
        "layers": _layer_names(result.frame),
        "layer_convention": (
            "layer 0: embedding output; 1..L: the residual stream after each block, before any "
            "final norm; L + 1 (final_norm): the final norm's output, for models that have one. "
            "The LM loss rows (lm_loss, bpc) are the whole model's, no layer: layer -1, "
            "layer_name model in the table, not listed in layers"
        ),
        "subjects": [
            {"label": s.label, "model": s.model, **{
                k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()}}
            for s in result.subjects
        ],
        "skipped": result.skipped,
        "weights": weights_by_revision(result.output_dir),
        "weights_copies": result.copies,
        "config": job.config,
        # The logger group as written: its ${output_dir} and ${run_name} unresolved, so that a
        # merge of shards (`shards.merge_shards`) logs into the merged folder, not a shard's.
        "logger": job.logger,
    }
    (result.output_dir / "probe_info.json").write_text(json.dumps(info, indent=2, default=str))


def _wandb_runs(job: ProbeJob, subjects: list) -> list:
    """The W&B runs of `job.logger` (offline unless logged in), with the probe's step axis;
    started by `repgeom.loggers.wandb_runs`, without Lightning, in the job's folder. The logger
    entries are read against the job's config, with the run name ``probe-<model>`` unless
    ``run_name`` gives one."""
    from repgeom.loggers import wandb_runs

    name = job.run_name or (
        f"probe-{subjects[0].model.replace('/', '-')}" if subjects else "probe")
    conf = OmegaConf.create({**job.config, "logger": job.logger, "run_name": name,
                             "output_dir": str(job.output_dir)})
    runs = wandb_runs(conf)
    for run in runs:
        sink.prepare_wandb_run(run, {"probe_run": job.config, "mode": job.mode})
    return runs


def _log_figures(run, paths: Iterable[Path], step: int) -> None:
    import wandb

    # A stack's figures are in plots/<stack>/: probe/plots/<stack>/<figure>.
    images = {
        f"probe/plots/{p.parent.name}/{p.stem}" if p.parent.name in STACKS
        else f"probe/plots/{p.stem}": wandb.Image(str(p))
        for p in paths
    }
    if images:
        run.log({**images, "probe/step": step})
