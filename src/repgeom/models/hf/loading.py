"""Loading a Hugging Face model and its tokenizer for probing: `load_hf_model`, `HFModel`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from repgeom.models.hf.families import (
    FAMILIES,
    is_decoder_by_experiment,
    is_decoder_from_config,
)
from repgeom.models.hf.qk import attention_implementation
from repgeom.models.hf.stacks import STACKS


@dataclass
class HFModel:
    """A loaded Hugging Face model with what the probes need to know about it.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The base model (``AutoModel``, or the base of ``lm``), in eval mode, eager attention
        (for the families whose queries and keys are read at the product, the family's eager
        attention that also hands them to repgeom: `repgeom.models.hf.qk.ATTENTION`).
    tokenizer : transformers.PreTrainedTokenizerBase
    family : str
        ``config.model_type`` (``"gpt2"``, ``"bert"``, ``"gpt_neox"``, ...).
    is_decoder : bool
        True for causal (decoder-only) models and the decoder stack of an encoder-decoder model,
        False for bidirectional encoders and the encoder stack.
    name : str
        What was passed to `load_hf_model` (hub name or local folder).
    revision : str or None
        Hub revision (branch, tag or commit), None for the default.
    stack : {"encoder", "decoder"} or None
        Which stack of an encoder-decoder model (T5, ByT5) is probed; None for a model with
        one stack.
    """

    model: Any
    tokenizer: Any
    family: str
    is_decoder: bool
    name: str
    revision: str | None = None
    stack: str | None = None
    lm: Any = None
    """The model with its language-model head (a decoder's ``AutoModelForCausalLM``, an
    encoder's ``AutoModelForMaskedLM``), whose base model is `model` (loaded once,
    `repgeom.models.hf.lm_head`); None: no loss rows."""
    _warned_qk: bool = field(default=False, init=False, repr=False, compare=False)
    _warned_layout: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def has_qk(self) -> bool:
        """Whether queries and keys can be read for this family."""
        family = FAMILIES.get(self.family)
        return family is not None and family.qk is not None

    @property
    def kind(self) -> str:
        """``"decoder"`` or ``"encoder"``, for tables and messages."""
        return "decoder" if self.is_decoder else "encoder"

    @property
    def blocks_owner(self) -> nn.Module:
        """The module whose blocks are probed: the base model, or the chosen stack of an
        encoder-decoder model (``model.encoder`` / ``model.decoder``, a full model of its own
        with its config, blocks and final norm)."""
        return self.model if self.stack is None else getattr(self.model, self.stack)


def looks_like_path(name: str) -> bool:
    """True when `name` can only be a local path, not a hub id ("name" or "org/name").

    A bare "contains a separator" rule would take every "org/name" hub id for a path, so a name
    with one "/" counts as a path only when its first part is a local folder ("outputs/run").
    """
    if name.startswith((".", "~", "/")) or name.endswith("/") or name.count("/") > 1:
        return True
    if "\\" in name:  # a Windows path
        return True
    return "/" in name and os.path.isdir(name.split("/")[0])


# Files one of which every saved Hugging Face tokenizer writes (fast: tokenizer.json; slow:
# a vocabulary file; sentencepiece: *.model).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json",
                    "spiece.model", "tokenizer.model", "sentencepiece.bpe.model", "merges.txt")

class TokenizerMissingError(ValueError):
    """A model folder holds no tokenizer and none was given."""


def load_tokenizer_or_explain(
    folder: str | os.PathLike, tokenizer: Any = None, *, revision: str | None = None,
    retry_budget_s: float | None = None,
) -> Any:
    """The tokenizer for a model folder or hub name, or a clear error when there is none.

    A folder written by ``model.save_pretrained`` alone has no tokenizer files, and
    ``AutoTokenizer.from_pretrained`` then still "succeeds" for some families with an empty
    vocabulary (every character becomes ``[UNK]``, or nothing at all for GPT-2's byte BPE: the
    probe would later fail with "the text is 0 tokens long"). Here such a folder raises at once,
    naming the fix. `load_hf_model` (``probe.py hf=... tokenizer=...``) and the analyses'
    subjects (`repgeom.analyses.subjects`) load tokenizers through this one function.

    Online, a hub name's tokenizer files are fetched by huggingface_hub's ``hf_hub_download``
    into the user's Hugging Face cache (`repgeom.models.hub.config_files.fetch_tokenizer_files`):
    its file list, then each config and tokenizer file at the listed commit, each call one try
    of one `repgeom.models.hub.calls.Retrier` of `retry_budget_s`, whose session hooks bound the
    library's own requests and retries by that budget (files the cache holds at that commit are
    not fetched again). Not with ``AutoTokenizer.from_pretrained(<hub name>)``, whose HEAD
    requests huggingface_hub retries by itself, silently, outside any budget. A cache that
    cannot be written: the files are fetched into a temporary folder of repgeom's, and the
    console says an offline rerun will not find them. Offline (``HF_HUB_OFFLINE=1``) the
    Hugging Face cache's copy is read and nothing asks the network.

    Parameters
    ----------
    folder : str or path
        A local model folder or a hub name.
    tokenizer : str, path or tokenizer object, optional
        Override: a hub name or folder to load the tokenizer from, or a loaded tokenizer.
    revision : str, optional
        Hub revision of `folder`'s own tokenizer; not applied to an override, which names its
        own source.
    retry_budget_s : float, optional
        Seconds of hub retries allowed for a hub name's tokenizer (the run's ``retry_budget_s=``;
        None: `repgeom.models.hub.calls.RETRY_BUDGET_S`).

    Returns
    -------
    transformers.PreTrainedTokenizerBase

    Raises
    ------
    TokenizerMissingError (a ValueError)
        "<folder> has no tokenizer; pass tokenizer=<name or folder>", or the tokenizer loaded
        has no vocabulary beyond its special tokens.
    OSError
        The hub could not provide a hub name's tokenizer: no answer within `retry_budget_s`
        (the message names the hub and says to rerun), or no such file (404).
    repgeom.models.hub.calls.HubAccessError
        The hub refused a hub name's tokenizer (401/403: gated, private or misspelt); the message
        names ``HF_TOKEN`` and the page where the licence is accepted.
    """
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    source = os.fspath(tokenizer if tokenizer is not None else folder)
    if os.path.isdir(source) and not any(
        os.path.isfile(os.path.join(source, f)) for f in _TOKENIZER_FILES
    ):
        if tokenizer is None:
            raise TokenizerMissingError(
                f"{folder} has no tokenizer; pass tokenizer=<name or folder> (for example the "
                "hub name of the model it was trained from, or a folder written by "
                "tokenizer.save_pretrained)"
            )
        raise TokenizerMissingError(f"tokenizer={source} is a folder without tokenizer files")
    tok = _load_tokenizer(source, revision if tokenizer is None else None, retry_budget_s)
    n_special = len(set(getattr(tok, "all_special_ids", [])))
    if len(tok) <= n_special:
        raise TokenizerMissingError(
            f"{source}: the tokenizer has no vocabulary beyond its {n_special} special tokens; "
            "pass tokenizer=<name or folder>"
        )
    return tok


def _load_tokenizer(source: str, revision: str | None, retry_budget_s: float | None) -> Any:
    """``AutoTokenizer`` of a folder, or of a hub name fetched as `load_tokenizer_or_explain`
    says."""
    import tempfile

    from huggingface_hub import is_offline_mode
    from transformers import AutoTokenizer

    from repgeom.models.hub.config_files import fetch_tokenizer_files

    if os.path.exists(source) or is_offline_mode():
        return AutoTokenizer.from_pretrained(source, revision=revision)
    if looks_like_path(source):
        raise FileNotFoundError(
            f"tokenizer={source!r}: no such local folder ({os.path.abspath(source)}); give a "
            "folder written by tokenizer.save_pretrained or a hub name like 'gpt2'"
        )
    with tempfile.TemporaryDirectory(prefix="repgeom-tokenizer-") as folder:
        return AutoTokenizer.from_pretrained(
            fetch_tokenizer_files(source, revision, folder, retry_budget_s))


def _read_config(name: str, revision: str | None, retry_budget_s: float | None = None) -> Any:
    """The model's ``AutoConfig``, after checking that a local name is a model folder.

    Online, a hub name's ``config.json`` is fetched by ``hf_hub_download`` into the user's
    Hugging Face cache (`repgeom.models.hub.config_files.fetch_config`), each call one try of a
    `repgeom.models.hub.calls.Retrier` with the run's `retry_budget_s` (None: the default, 15
    minutes), whose session hooks bound the library's requests (and end its own silent retries
    of a HEAD, with a 60 s timeout, minutes outside any budget) by that budget. Offline, the
    Hugging Face cache's copy is read (nothing asks the network).
    """
    from transformers import AutoConfig

    local = os.path.exists(name)
    if not local and looks_like_path(name):
        raise FileNotFoundError(
            f"hf={name!r}: no such local folder ({os.path.abspath(name)}); "
            "give a folder written by save_pretrained or a hub name like 'gpt2'"
        )
    if local and not os.path.isfile(os.path.join(name, "config.json")):
        raise ValueError(
            f"hf={name!r} is not a Hugging Face model folder (no config.json in it); "
            "for a repgeom checkpoint use ckpt= instead"
        )
    try:
        from huggingface_hub import is_offline_mode

        if not local and not is_offline_mode():
            return _hub_config(name, revision, retry_budget_s)
        return AutoConfig.from_pretrained(name, revision=revision)
    except OSError as e:
        raise OSError(
            f"could not load hf={name!r} (revision={revision!r}) from the Hugging Face hub: {e}"
        ) from e


def _hub_config(name: str, revision: str | None, retry_budget_s: float | None) -> Any:
    """The ``AutoConfig`` of hub model `name` at `revision`, read within `retry_budget_s`
    (`repgeom.models.hub.config_files.fetch_config`)."""
    import tempfile

    from transformers import AutoConfig

    from repgeom.models.hub.config_files import fetch_config

    with tempfile.TemporaryDirectory(prefix="repgeom-config-") as folder:
        return AutoConfig.from_pretrained(fetch_config(name, revision, folder, retry_budget_s))


def _expand(name: str | os.PathLike) -> str:
    name = os.fspath(name)
    return os.path.expanduser(name) if name.startswith("~") else name


def model_stacks(name_or_path: str | os.PathLike, *, revision: str | None = None,
                 retry_budget_s: float | None = None) -> tuple:
    """``("encoder", "decoder")`` for an encoder-decoder model (T5, ByT5), ``(None,)`` for a
    model with one stack: what `load_hf_model`'s ``stack`` takes, read from the config alone
    (for a hub name, fetched within `retry_budget_s`: the run's ``retry_budget_s=``)."""
    config = _read_config(_expand(name_or_path), revision, retry_budget_s)
    return STACKS if getattr(config, "is_encoder_decoder", False) else (None,)


def load_hf_model(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    tokenizer: Any = None,
    stack: str | None = None,
    retry_budget_s: float | None = None,
) -> HFModel:
    """Load a Hugging Face model and its tokenizer for probing.

    Parameters
    ----------
    name_or_path : str or path
        A hub name (``"gpt2"``, ``"EleutherAI/pythia-160m"``) or a local folder written by
        ``save_pretrained``.
    revision : str, optional
        Hub branch, tag or commit (e.g. Pythia's ``"step1000"``); ignored for local folders.
    device : str or torch.device
    dtype : torch.dtype or str, optional
        Weights dtype; None keeps the transformers default.
    tokenizer : str, path or tokenizer object, optional
        Where the tokenizer comes from when the model's folder has none (a folder written by
        ``model.save_pretrained`` alone): a hub name or folder (`load_tokenizer_or_explain`).
    stack : {"encoder", "decoder"}, optional
        Required for an encoder-decoder model (`model_stacks`), which is probed as two models:
        see `hf_capture` for how each stack is run. None for every other model.
    retry_budget_s : float, optional
        Seconds of hub retries allowed for a hub name's config and tokenizer (the run's
        ``retry_budget_s=``; None: the default). ``AutoModel.from_pretrained`` fetches a hub
        name's weights by itself, outside it: ``probe.py`` hands it the folder the trajectory
        fetched (`repgeom.models.hub.downloads`).

    Returns
    -------
    HFModel

    Raises
    ------
    FileNotFoundError
        A local path that does not exist.
    ValueError
        A folder without ``config.json``; a folder without a tokenizer and no `tokenizer`
        (`TokenizerMissingError`); a tokenizer with more tokens than the model's embedding;
        `stack` missing for an encoder-decoder model or given for another.
    OSError
        The hub could not provide the model (offline, unknown name or revision).
    """
    from transformers import AutoModel

    from repgeom.models.hf.lm_head import load_with_head

    name = _expand(name_or_path)
    config = _read_config(name, revision, retry_budget_s)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and stack not in STACKS:
        raise ValueError(
            f"hf={name!r} is an encoder-decoder model ({config.model_type}); pass "
            f"stack='encoder' or stack='decoder' (got {stack!r}): each stack is probed as a model"
        )
    if not encoder_decoder and stack is not None:
        raise ValueError(f"stack={stack!r}: hf={name!r} has one stack of layers; pass stack=None")
    if getattr(config, "text_config", None) is not None and not hasattr(
            config, "num_hidden_layers"):
        raise ValueError(
            f"hf={name!r} is a multimodal model ({config.model_type}: a text_config inside its "
            "config); repgeom probes a text model's stack of blocks: save its language model "
            "alone (model.language_model.save_pretrained(folder), with the tokenizer) and probe "
            "that folder, or a text-only release of the family (Gemma 3 1B is gemma3_text)"
        )
    tok = load_tokenizer_or_explain(name, tokenizer, revision=revision,
                                    retry_budget_s=retry_budget_s)
    kwargs: dict[str, Any] = {"revision": revision,
                              "attn_implementation": attention_implementation(config.model_type)}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if encoder_decoder:
        model, lm = AutoModel.from_pretrained(name, **kwargs), None
    else:  # a decoder with its head where the weights hold one (the loss rows)
        model, lm = load_with_head(name, kwargs, is_decoder_from_config(config))
    model = model.to(device).eval()
    lm = None if lm is None else lm.to(device).eval()
    rows = model.get_input_embeddings().num_embeddings
    if tokenizer is not None and len(tok) > rows:
        raise ValueError(
            f"tokenizer={tokenizer!r} has {len(tok)} tokens but {name}'s embedding has {rows} "
            "rows; pass the tokenizer the model was trained with"
        )
    if encoder_decoder:
        is_decoder = stack == "decoder"
    else:
        is_decoder = is_decoder_from_config(model.config)
        if is_decoder is None:
            is_decoder = is_decoder_by_experiment(model)
    return HFModel(model, tok, config.model_type, is_decoder, name, revision, stack, lm)
