"""Which weight files a revision needs: the one rule for "the weights of a revision", used
wherever a revision's weights are named: the user's cache, a local folder, a download and the
hub's hashes (`repgeom.models.hub.downloads`, `repgeom.models.hub.revisions`).

A rule of file names, never a hub call: the caller lists a revision's files and hands over the
text of its indexes (`weights_of`'s ``read_index``: read from a folder, or fetched by
`repgeom.models.hub`); `folder_weights` reads a local folder, nothing else.

Of the top-level files of a revision:

1. **the index first**: a format with an index (``model.safetensors.index.json``,
   ``pytorch_model.bin.index.json``) is the shards its ``weight_map`` names, and only those (a
   consolidated ``model.safetensors`` beside the shards is not fetched twice); a format whose
   index names a shard that is not there is incomplete (`Weights.missing`);
2. **safetensors over .bin**: the first complete format is the one loaded and downloaded
   (`Weights.files`); the others are kept in `Weights.formats` so that a ``.bin``-only revision
   and a revision with the safetensors conversion of the same weights can still be compared
   (`same_weights`);
3. **training-state files excluded**: a Trainer pushes ``training_args.bin``, ``optimizer.bin``,
   ``scheduler.pt``, ``rng_state*.pth`` beside the model; they are not weights (`TRAINING_STATE`).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = (".safetensors", ".bin")
"""Weights formats in order of preference; one is fetched."""
INDEX = ".index.json"
"""The suffix of a sharded format's index: ``<weights name><format>.index.json``."""
TRAINING_STATE = ("training_args.bin", "optimizer*", "scheduler*", "scaler*", "rng_state*",
                  "trainer_state*")
"""Files that the Hugging Face ``Trainer`` pushes beside the model and that are not weights."""


def weight_map(text: str) -> set[str]:
    """The shard names an index's ``weight_map`` lists (the text of ``*.index.json``).

    Raises
    ------
    ValueError
        The text is not an index (not JSON, or no ``weight_map`` of names).
    """
    try:
        mapping = json.loads(text).get("weight_map")
    except (ValueError, AttributeError) as error:
        raise ValueError(f"not a weights index ({error})") from error
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise ValueError("not a weights index: no weight_map of shard names")
    return set(mapping.values())


def is_training_state(name: str) -> bool:
    """Whether `name` is one of the Trainer's state files (`TRAINING_STATE`), not weights."""
    return any(fnmatch.fnmatch(Path(name).name, pattern) for pattern in TRAINING_STATE)


@dataclass(frozen=True)
class Weights:
    """A revision's weights by the rule (see the module docstring).

    formats : each complete format (``".safetensors"``, ``".bin"``) -> its files, preferred
    first; missing : each format whose index names files that are not there -> those files;
    indexes : the index files of the formats in `formats`.
    """

    formats: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: dict[str, tuple[str, ...]] = field(default_factory=dict)
    indexes: tuple[str, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        """The files of the preferred complete format (what is loaded); empty when none is."""
        return next(iter(self.formats.values()), ())

    @property
    def index(self) -> str | None:
        """The index of the preferred format, if it is sharded."""
        chosen = next(iter(self.formats), None)
        return next((i for i in self.indexes if i.endswith(f"{chosen}{INDEX}")), None)


def weights_of(names: Iterable[str], read_index: Callable[[str], str]) -> Weights:
    """The weights among `names` (a revision's top-level file names) by the rule.

    read_index : the text of an index file named in `names` (read from a folder, or fetched);
    an index that cannot be read (OSError, ValueError) makes its format incomplete.
    """
    names = sorted({n for n in names if "/" not in n})
    present = set(names)
    formats: dict[str, tuple[str, ...]] = {}
    missing: dict[str, tuple[str, ...]] = {}
    indexes = []
    for suffix in FORMATS:
        index = sorted(n for n in names if n.endswith(f"{suffix}{INDEX}"))
        if index:
            shards: set[str] = set()
            try:
                for name in index:
                    shards |= weight_map(read_index(name))
            except (OSError, ValueError) as error:
                missing[suffix] = (f"<{index[0]} unreadable: {error}>",)
                continue
            lacking = tuple(sorted(shards - present))
            if lacking or not shards:
                missing[suffix] = lacking or (f"<{index[0]} names no shard>",)
                continue
            formats[suffix], indexes = tuple(sorted(shards)), [*indexes, *index]
            continue
        files = tuple(n for n in names if n.endswith(suffix) and not is_training_state(n))
        if files:
            formats[suffix] = files
    return Weights(formats, missing, tuple(indexes))


def folder_weights(folder: Path) -> Weights:
    """`weights_of` the files in `folder` (a broken cache link is not a file)."""
    names = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    return weights_of(names, lambda name: (folder / name).read_text())


def by_format(hashes: Mapping[str, str]) -> dict[str, tuple[tuple[str, str], ...]]:
    """{file: sha256} split by format: format -> sorted (file, sha256) pairs."""
    split: dict[str, list[tuple[str, str]]] = {}
    for name, sha in hashes.items():
        split.setdefault(Path(name).suffix, []).append((name, sha))
    return {suffix: tuple(sorted(pairs)) for suffix, pairs in split.items()}


def same_weights(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Whether two revisions' weights hashes ({file: sha256}, every complete format) hold the
    same weights: some format that both have has equal files and hashes.

    >>> same_weights({"m.bin": "x", "m.safetensors": "y"}, {"m.bin": "x"})
    True
    >>> same_weights({"m.bin": "x"}, {"m.safetensors": "x"})
    False
    """
    left, right = by_format(a), by_format(b)
    return any(left[f] == right[f] for f in left.keys() & right.keys())
