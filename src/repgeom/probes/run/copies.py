"""Weights identity across a trajectory's revisions: which serve another revision's weights.

Each step's weights files and their sha256, for every complete weights format by the one rule
(`repgeom.models.weights_rule`; the hub's LFS sha256, no extra download; the file's own for
the user's cache), are in ``timings.csv`` (`repgeom.probes.run.costs`); two revisions hold the
same weights when a format both have is equal (`repgeom.models.weights_rule.same_weights`).
Revisions that serve the same weights (Pythia-2.8b serves final-era weights under 86 of its step
branches, EleutherAI/pythia#205) or share a weights file (a shard: Pythia-12b, #206) are warned
about once, by name; a revision whose weights are all another's is a copy, and its rows carry
that revision's name in the table's ``weights_copy_of`` column (`COPY_COLUMN`), which phase
detection reads to leave the copies out (`copies`). Of a group of identical weights the latest
step is kept as the true one: a name cannot hold weights trained past it.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pandas as pd

from repgeom.models.weights_rule import by_format
from repgeom.probes.core import table
from repgeom.probes.report import phases
from repgeom.probes.run.costs import TIMINGS
from repgeom.probes.run.resume import read_for_resume

COPY_COLUMN = phases.COPY_COLUMN
"""The table column naming the revision whose weights a copy serves (empty for the others)."""


def weights_by_revision(output_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """Revision -> {weights file: sha256} of every probed hub revision, in step order, from
    ``timings.csv`` (revisions without weights files left out)."""
    path = table.probe_dir(output_dir) / TIMINGS
    if not path.is_file():
        return {}
    costs = pd.read_csv(path, dtype={"revision": str, "weights_sha256": str})
    if "weights_sha256" not in costs.columns:
        return {}
    costs = costs.dropna(subset=["revision", "weights_sha256"])
    costs = costs.drop_duplicates("revision", keep="last").sort_values("step", kind="stable")
    return {r: json.loads(w) for r, w in zip(costs["revision"], costs["weights_sha256"],
                                             strict=True) if w and w != "{}"}


def copies(weights: dict[str, dict[str, str]]
           ) -> tuple[dict[str, str], dict[tuple[str, str], list[str]]]:
    """Which revisions serve other revisions' weights.

    Parameters
    ----------
    weights : dict
        Revision -> {weights file name: sha256}, in step order.

    Returns
    -------
    copies : dict
        Copy -> original, for each revision that holds another's weights: a weights format
        both have is equal, files and hashes (a ``.bin``-only revision and the safetensors
        conversion beside the same ``.bin``); the original is the latest revision of the group (a
        name cannot hold weights trained past it).
    shared : dict
        (revision a, revision b) -> the files of equal sha256 they share without being copies.

    >>> copies({"s1": {"m.bin": "a"}, "s2": {"m.bin": "b"}, "s3": {"m.bin": "b"}})[0]
    {'s2': 's3'}
    """
    group = {revision: revision for revision in weights}  # union-find over equal formats

    def root(revision: str) -> str:
        while group[revision] != revision:
            revision = group[revision]
        return revision

    holder: dict[tuple, str] = {}
    for revision, files in weights.items():
        for key in by_format(files).items():  # (format, its files and hashes)
            if key in holder:
                group[root(revision)] = root(holder[key])
            else:
                holder[key] = revision
    members: dict[str, list[str]] = {}
    for revision in weights:  # in step order
        members.setdefault(root(revision), []).append(revision)
    found = {copy: g[-1] for g in members.values() for copy in g[:-1]}
    originals = [r for r in weights if r not in found]
    by_hash: dict[str, list[tuple[str, str]]] = {}
    for revision in originals:
        for name, sha in weights[revision].items():
            by_hash.setdefault(sha, []).append((revision, name))
    shared: dict[tuple[str, str], list[str]] = {}
    for holders in by_hash.values():
        for i, (a, name) in enumerate(holders):
            for b, _ in holders[i + 1:]:
                if a != b:
                    shared.setdefault((a, b), []).append(name)
    return found, shared


def mark_copies(output_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Find the revisions that serve another's weights (``timings.csv``), warn once naming
    them, and write each copy's rows with ``weights_copy_of`` = the revision it copies.

    A copy is a revision whose weights files are all, by sha256, another's; of a group of
    identical weights the latest step is the true one. A shared file without equal weights
    (one shard of several) is warned about too, and not marked.

    Returns
    -------
    copies : dict
        {copy: original}.
    messages : list of str
        The warnings given.
    """
    found, shared = copies(weights_by_revision(output_dir))
    messages: list[str] = []
    if found:
        groups: dict[str, list[str]] = {}
        for copy, original in found.items():
            groups.setdefault(original, []).append(copy)
        messages.append("same weights under several revisions (their rows are marked "
                        f"{COPY_COLUMN} in the table, and phase detection leaves them out): "
                        + "; ".join(f"{', '.join(c)} serve the weights of {o}"
                                    for o, c in groups.items()))
    for (a, b), files in shared.items():
        messages.append(f"{a} and {b} share weights file(s) {', '.join(files)} (same sha256)")
    for message in messages:
        warnings.warn(message, stacklevel=3)
    if found:
        frame = read_for_resume(output_dir)
        if "revision" in frame.columns:
            frame[COPY_COLUMN] = frame["revision"].map(found).fillna("")
            table.write_table(frame, table.probe_dir(output_dir))
    return found, messages
