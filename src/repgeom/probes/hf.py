"""Hugging Face models as probe subjects: load one, cut text into windows, capture its states.

`hf_capture` fills the same `Capture` as our own `GPT.capture()`, so every probe reads one format:

- hidden states: the residual stream, as `GPT.capture()` returns it: the embedding output at
  index 0 and the output of every block, *before* any final norm. Hugging Face's
  `output_hidden_states` gives the embedding output and the input of every block, but for
  pre-LN models (GPT-2, GPT-NeoX, OPT, Llama, Mistral, XLM-RoBERTa-XL) its last entry is the
  final norm's output; so the last entry is replaced by the last block's output, read with a
  forward hook on that block.
- final norm: the output of the norm the base model applies after its stack of blocks
  (``Capture.final_norm``, probed as its own layer ``final_norm``). The rule that finds it: the
  stack of blocks is the ``nn.ModuleList`` with ``num_hidden_layers`` entries; the final norm is
  the normalisation module (a ``LayerNorm``/``RMSNorm``, by class name) that is a direct child
  of the stack's parent or of the base model itself, outside the embeddings: GPT-2 ``ln_f``,
  GPT-NeoX ``final_layer_norm``, OPT ``decoder.final_layer_norm`` (absent for post-LN OPT
  configs), Llama/Mistral ``norm``, XLM-RoBERTa-XL ``encoder.LayerNorm``. BERT, RoBERTa and
  ELECTRA (post-LN) have none. A hook checks on every pass that the module's input is the last
  block's output, so a family laid out differently fails loudly instead of being mismeasured.
- attention probabilities: `output_attentions`; the model is loaded with eager attention, the only
  implementation that materialises them.
- queries and keys: forward hooks on the attention projections of the families below, split into
  heads, rotated by the model's own rotary function where the family uses one, and with
  grouped-query key heads repeated to the number of query heads. A "query" is defined so that
  ``softmax(Q @ K.T / sqrt(D) + mask)`` is exactly the model's attention: where a model scales
  its scores by something other than 1/sqrt(D) (GPT-2's ``scale_attn_by_inverse_layer_idx``),
  the extra factor is folded into Q. OPT multiplies the output of ``q_proj`` by 1/sqrt(D) before
  the product; our Q is the unscaled ``q_proj`` output, as for every other family.

  ==============  =============================  ==============================================
  family          hooked modules                 queries and keys
  ==============  =============================  ==============================================
  gpt2            ``attn.c_attn`` (Conv1D)       q, k, v = split of the fused output
  bert,           ``attention.self.query/.key``  the two Linear outputs
  roberta,
  xlm-roberta-xl
  gpt_neox        ``attention.query_key_value``  per head [q | k | v] interleaved, then rotary on
                                                 the first ``rotary_pct`` of each head's dims
  opt             ``self_attn.q_proj/.k_proj``   the two Linear outputs (before OPT's scaling)
  llama,          ``self_attn.q_proj/.k_proj``   rotary, then KV heads repeated (grouped-query)
  mistral
  t5 (ByT5)       ``SelfAttention.q/.k``         the two Linear outputs, times sqrt(D): T5 does
                                                 not scale its scores (``scaling = 1``); its
                                                 relative position bias, added to the scores, is
                                                 not part of Q K^T (cross-attention not hooked)
  ==============  =============================  ==============================================

  The rotary cos/sin are read from the attention module's ``position_embeddings`` argument (a
  forward pre-hook with ``with_kwargs=True``) and applied with ``apply_rotary_pos_emb`` from the
  family's own modeling module, so partial rotary (Pythia) and scaled RoPE variants are exactly
  the model's. Any other family still gets hidden states and attention; its queries and keys are
  left empty with one warning per loaded model.

Encoder or decoder is read from the config (``is_decoder``, the family name, then the
architecture names such as ``*ForCausalLM`` / ``*ForMaskedLM``); when the config says nothing,
one tiny forward pass decides: a decoder's early positions do not change when a later token does.

Encoder-decoder models (``is_encoder_decoder``: T5, ByT5) are probed as two models, one per
stack (``HFModel.stack``), each with its own embedding, blocks and final norm (T5's
``final_layer_norm`` in both stacks, measured as the layer ``final_norm`` as above):

- the encoder: ``model.encoder`` alone on the text's windows, bidirectional;
- the decoder: the whole model with the same window as ``input_ids`` and as
  ``decoder_input_ids`` (not shifted right behind a start token), so the decoder reads the text
  causally while its cross-attention reads the encoder's states of that same window. This keeps
  the two stacks' rows on the same tokens and positions (the same probe set, special tokens and
  padding masks), and position t of the decoder holds token t as input, as in a decoder-only
  model. It is a reconstruction setting, not T5's span-corruption pre-training task: the
  decoder can read the whole window through cross-attention, so it is causal in its own
  self-attention only.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from repgeom.models.capture import Capture

# Families known by name. Others are told apart by their architecture names or by experiment.
DECODER_FAMILIES = frozenset({"gpt2", "gpt_neox", "opt", "llama", "mistral"})
ENCODER_FAMILIES = frozenset({"bert", "roberta", "xlm-roberta-xl"})


@dataclass
class HFModel:
    """A loaded Hugging Face model with what the probes need to know about it.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        The base model (``AutoModel``), in eval mode, eager attention.
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
    _warned_qk: bool = field(default=False, init=False, repr=False, compare=False)
    _warned_layout: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def has_qk(self) -> bool:
        """Whether queries and keys can be read for this family."""
        return self.family in _QK_FAMILIES

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


# --------------------------------------------------------------------------------------------
# Loading


def _looks_like_path(name: str) -> bool:
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

STACKS = ("encoder", "decoder")
"""The two stacks of an encoder-decoder model, probed as two models in this order."""


class TokenizerMissingError(ValueError):
    """A model folder holds no tokenizer and none was given."""


def load_tokenizer_or_explain(
    folder: str | os.PathLike, tokenizer: Any = None, *, revision: str | None = None
) -> Any:
    """The tokenizer for a model folder or hub name, or a clear error when there is none.

    A folder written by ``model.save_pretrained`` alone has no tokenizer files, and
    ``AutoTokenizer.from_pretrained`` then still "succeeds" for some families with an empty
    vocabulary (every character becomes ``[UNK]``, or nothing at all for GPT-2's byte BPE: the
    probe would later fail with "the text is 0 tokens long"). Here such a folder raises at once,
    naming the fix. `load_hf_model` (``probe.py hf=... tokenizer=...``) and the analyses'
    subjects (`repgeom.analyses.subjects`) load tokenizers through this one function.

    Parameters
    ----------
    folder : str or path
        A local model folder or a hub name.
    tokenizer : str, path or tokenizer object, optional
        Override: a hub name or folder to load the tokenizer from, or a loaded tokenizer.
    revision : str, optional
        Hub revision of `folder`'s own tokenizer; not applied to an override, which names its
        own source.

    Returns
    -------
    transformers.PreTrainedTokenizerBase

    Raises
    ------
    TokenizerMissingError (a ValueError)
        "<folder> has no tokenizer; pass tokenizer=<name or folder>", or the tokenizer loaded
        has no vocabulary beyond its special tokens.
    """
    from transformers import AutoTokenizer

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
    tok = AutoTokenizer.from_pretrained(source, revision=revision if tokenizer is None else None)
    n_special = len(set(getattr(tok, "all_special_ids", [])))
    if len(tok) <= n_special:
        raise TokenizerMissingError(
            f"{source}: the tokenizer has no vocabulary beyond its {n_special} special tokens; "
            "pass tokenizer=<name or folder>"
        )
    return tok


def _read_config(name: str, revision: str | None) -> Any:
    """The model's ``AutoConfig``, after checking that a local name is a model folder."""
    from transformers import AutoConfig

    local = os.path.exists(name)
    if not local and _looks_like_path(name):
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
        return AutoConfig.from_pretrained(name, revision=revision)
    except OSError as e:
        raise OSError(
            f"could not load hf={name!r} (revision={revision!r}) from the Hugging Face hub: {e}"
        ) from e


def _expand(name: str | os.PathLike) -> str:
    name = os.fspath(name)
    return os.path.expanduser(name) if name.startswith("~") else name


def model_stacks(name_or_path: str | os.PathLike, *, revision: str | None = None) -> tuple:
    """``("encoder", "decoder")`` for an encoder-decoder model (T5, ByT5), ``(None,)`` for a
    model with one stack: what `load_hf_model`'s ``stack`` takes, read from the config alone."""
    config = _read_config(_expand(name_or_path), revision)
    return STACKS if getattr(config, "is_encoder_decoder", False) else (None,)


def load_hf_model(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    tokenizer: Any = None,
    stack: str | None = None,
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

    name = _expand(name_or_path)
    config = _read_config(name, revision)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    if encoder_decoder and stack not in STACKS:
        raise ValueError(
            f"hf={name!r} is an encoder-decoder model ({config.model_type}); pass "
            f"stack='encoder' or stack='decoder' (got {stack!r}): each stack is probed as a model"
        )
    if not encoder_decoder and stack is not None:
        raise ValueError(f"stack={stack!r}: hf={name!r} has one stack of layers; pass stack=None")
    tok = load_tokenizer_or_explain(name, tokenizer, revision=revision)
    kwargs: dict[str, Any] = {"revision": revision, "attn_implementation": "eager"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModel.from_pretrained(name, **kwargs).to(device).eval()
    rows = model.get_input_embeddings().num_embeddings
    if tokenizer is not None and len(tok) > rows:
        raise ValueError(
            f"tokenizer={tokenizer!r} has {len(tok)} tokens but {name}'s embedding has {rows} "
            "rows; pass the tokenizer the model was trained with"
        )
    if encoder_decoder:
        is_decoder = stack == "decoder"
    else:
        is_decoder = _is_decoder_from_config(model.config)
        if is_decoder is None:
            is_decoder = _is_decoder_by_experiment(model)
    return HFModel(model, tok, config.model_type, is_decoder, name, revision, stack)


def _is_decoder_from_config(config: Any) -> bool | None:
    """Decoder (True), encoder (False), or None when the config does not say."""
    if getattr(config, "is_decoder", False):  # e.g. BERT configured as a causal decoder
        return True
    if config.model_type in DECODER_FAMILIES:
        return True
    if config.model_type in ENCODER_FAMILIES:
        return False
    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return True
    if any(a.endswith("ForMaskedLM") for a in architectures):
        return False
    return None


@torch.no_grad()
def _is_decoder_by_experiment(model: nn.Module) -> bool:
    """Change the last of three tokens: a causal model's first two positions do not move."""
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
    ids = torch.tensor([[1, 2, 3], [1, 2, 4]], device=device) % vocab
    h = model(input_ids=ids).last_hidden_state.float()  # (2, 3, C)
    # Rows are computed in one batch, so equal inputs give equal outputs up to rounding.
    return torch.allclose(h[0, :2], h[1, :2], rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Windows of text


def tokenize_windows(
    hf: HFModel, text: str, *, window: int, n_windows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut `text` into fixed, non-overlapping windows of `window` tokens.

    The text is tokenized once, without special tokens, and cut into chunks; each window then
    gets the special tokens the tokenizer adds to a single sequence (CLS ... SEP for BERT, BOS
    first for Llama, none for GPT-2), so every row is `window` tokens long in all.

    Parameters
    ----------
    hf : HFModel
    text : str
    window : int
        Tokens per row, special tokens included.
    n_windows : int, optional
        Number of windows, from the start of the text; None takes every full window.

    Returns
    -------
    input_ids : (N, window) int64 tensor
    attention_mask : (N, window) int64 tensor of ones (windows are never padded)

    Raises
    ------
    ValueError
        `window` too small for the special tokens or longer than the model's positions, or the
        text too short for one window (or for `n_windows`).
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if n_windows is not None and (not isinstance(n_windows, int) or n_windows < 1):
        raise ValueError(f"n_windows must be a positive integer or None, got {n_windows!r}")
    max_positions = getattr(hf.model.config, "max_position_embeddings", None)
    if max_positions is not None and window > max_positions:
        raise ValueError(f"window={window} is longer than {hf.name}'s {max_positions} positions")
    tok = hf.tokenizer
    prefix, suffix = _special_template(tok, text)
    n_special = len(prefix) + len(suffix)
    content = window - n_special
    if content < 1:
        raise ValueError(
            f"window={window} leaves no room for text after the {n_special} special tokens "
            f"{tok.convert_ids_to_tokens(prefix + suffix)} that {hf.name} adds"
        )
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    available = len(ids) // content
    if available == 0:
        raise ValueError(
            f"the text is {len(ids)} tokens long ({len(text)} characters); one window of "
            f"{window} tokens needs {content} text tokens"
            + (f" plus {n_special} special tokens" if n_special else "")
            + "; use a longer text or a smaller window"
        )
    if n_windows is not None and n_windows > available:
        raise ValueError(
            f"n_windows={n_windows} but the text ({len(ids)} tokens) holds only {available} "
            f"windows of {window} tokens"
        )
    n = available if n_windows is None else n_windows
    rows = [prefix + ids[i * content : (i + 1) * content] + suffix for i in range(n)]
    input_ids = torch.tensor(rows, dtype=torch.long)  # (N, window)
    return input_ids, torch.ones_like(input_ids)


def _special_template(tok: Any, text: str) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one sequence, found by encoding a sample.

    Works for every tokenizer backend (fast, sentencepiece, python), unlike
    ``build_inputs_with_special_tokens`` which fast tokenizers no longer have in transformers 5.
    """
    sample = text[:32] or "a"
    bare = tok(sample, add_special_tokens=False, verbose=False)["input_ids"]
    full = tok(sample, add_special_tokens=True, verbose=False)["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise RuntimeError(
        "cannot tell which special tokens the tokenizer adds: the text encoded with special "
        f"tokens ({full}) does not contain it encoded without ({bare})"
    )


# --------------------------------------------------------------------------------------------
# Queries and keys, per family


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, H*D) -> (B, H, T, D)."""
    B, T, _ = x.shape
    return x.view(B, T, -1, head_dim).transpose(1, 2)


def _qk_gpt2(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = out["c_attn"].split(attn.split_size, dim=2)  # (B, T, C) each
    return _heads(q, attn.head_dim), _heads(k, attn.head_dim)


def _qk_bert(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    D = attn.attention_head_size
    return _heads(out["query"], D), _heads(out["key"], D)


def _qk_neox(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    # The fused output is laid out per head as [q_h | k_h | v_h], not as [q | k | v].
    qkv = out["query_key_value"]  # (B, T, 3C)
    B, T, _ = qkv.shape
    qkv = qkv.view(B, T, -1, 3 * attn.head_size).transpose(1, 2)  # (B, H, T, 3D)
    q, k, _ = qkv.chunk(3, dim=-1)
    return q, k


def _qk_proj(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    # Llama/Mistral give k fewer heads than q under grouped-query attention: (B, Hkv, T, D).
    return _heads(out["q_proj"], attn.head_dim), _heads(out["k_proj"], attn.head_dim)


def _qk_t5(attn: nn.Module, out: dict) -> tuple[torch.Tensor, torch.Tensor]:
    D = attn.key_value_proj_dim
    return _heads(out["q"], D), _heads(out["k"], D)


@dataclass(frozen=True)
class _QKFamily:
    attention: tuple[str, ...]  # class names of the self-attention modules, one per layer
    projections: tuple[str, ...]  # their submodules whose outputs are hooked
    split: Callable[[nn.Module, dict], tuple[torch.Tensor, torch.Tensor]]
    rotary: bool = False
    cross: tuple[str, ...] = ()  # attribute names of same-class cross-attention modules, skipped


_QK_FAMILIES: dict[str, _QKFamily] = {
    "gpt2": _QKFamily(("GPT2Attention",), ("c_attn",), _qk_gpt2),
    "bert": _QKFamily(("BertSelfAttention",), ("query", "key"), _qk_bert),
    "roberta": _QKFamily(("RobertaSelfAttention",), ("query", "key"), _qk_bert),
    "xlm-roberta-xl": _QKFamily(("XLMRobertaXLSelfAttention",), ("query", "key"), _qk_bert),
    "gpt_neox": _QKFamily(("GPTNeoXAttention",), ("query_key_value",), _qk_neox, rotary=True),
    "opt": _QKFamily(("OPTAttention",), ("q_proj", "k_proj"), _qk_proj),
    "llama": _QKFamily(("LlamaAttention",), ("q_proj", "k_proj"), _qk_proj, rotary=True),
    "mistral": _QKFamily(("MistralAttention",), ("q_proj", "k_proj"), _qk_proj, rotary=True),
    "t5": _QKFamily(("T5Attention",), ("q", "k"), _qk_t5, cross=("EncDecAttention",)),
}


class _QKRecorder:
    """Hooks on every layer's attention projections; `collect()` turns what they saw into Q, K."""

    def __init__(self, model: nn.Module, family: str) -> None:
        self.spec = _QK_FAMILIES[family]
        self.layers = [
            m
            for name, m in model.named_modules()
            if type(m).__name__ in self.spec.attention
            and not getattr(m, "is_cross_attention", False)
            and name.rpartition(".")[2] not in self.spec.cross
        ]
        n_layer = model.config.num_hidden_layers
        if len(self.layers) != n_layer:
            raise RuntimeError(
                f"found {len(self.layers)} {'/'.join(self.spec.attention)} modules in a {family} "
                f"model with {n_layer} layers; this transformers version lays {family} out "
                "differently from what repgeom.probes.hf expects"
            )
        self.seen: list[dict[str, Any]] = [{} for _ in self.layers]
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> _QKRecorder:
        for attn, seen in zip(self.layers, self.seen, strict=True):
            for name in self.spec.projections:
                self.handles.append(getattr(attn, name).register_forward_hook(_store(seen, name)))
            if self.spec.rotary:
                hook = _store_position_embeddings(seen, inspect.signature(attn.forward))
                self.handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def collect(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        queries, keys = [], []
        for i, (attn, seen) in enumerate(zip(self.layers, self.seen, strict=True)):
            required = self.spec.projections + (
                ("position_embeddings",) if self.spec.rotary else ()
            )
            missing = [name for name in required if seen.get(name) is None]
            if missing:
                raise RuntimeError(f"layer {i}: the forward pass never reached {missing}")
            q, k = self.spec.split(attn, seen)  # (B, H, T, D), (B, Hkv, T, D)
            if self.spec.rotary:
                cos, sin = seen["position_embeddings"]
                q, k = _rotary_function(attn)(q, k, cos, sin)
            if k.size(1) != q.size(1):  # grouped-query attention, as transformers' repeat_kv
                k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)  # (B, H, T, D)
            # Fold any score scale other than 1/sqrt(D) into Q, so Q K^T / sqrt(D) is the score.
            D = q.size(-1)
            factor = getattr(attn, "scaling", D**-0.5) * math.sqrt(D)
            if not math.isclose(factor, 1.0, rel_tol=1e-9):
                q = q * factor
            queries.append(q.contiguous())
            keys.append(k.contiguous())
        return queries, keys


def _store(seen: dict, name: str) -> Callable:
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        seen[name] = output

    return hook


def _store_position_embeddings(seen: dict, signature: inspect.Signature) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["position_embeddings"] = signature.bind_partial(*args, **kwargs).arguments.get(
            "position_embeddings"
        )

    return hook


def _rotary_function(attn: nn.Module) -> Callable:
    """The family's own ``apply_rotary_pos_emb(q, k, cos, sin)``, from its modeling module."""
    fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise RuntimeError(f"{type(attn).__module__} has no apply_rotary_pos_emb")
    return fn


# --------------------------------------------------------------------------------------------
# Residual stream and final norm


def block_stack(model: nn.Module) -> nn.ModuleList:
    """The model's stack of blocks: the ``nn.ModuleList`` with ``num_hidden_layers`` entries.

    Lists inside another such list are sublayers of a block, not the stack (a T5 block's
    ``layer`` list has 2 or 3 entries, as many as a tiny T5 has blocks).

    Raises
    ------
    RuntimeError
        No such list, or more than one (the layout is not one repgeom knows how to read).
    """
    n_layer = model.config.num_hidden_layers
    lists = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) == n_layer
    ]
    stacks = [name for name in lists if not any(name.startswith(f"{o}.") for o in lists)]
    if len(stacks) != 1:
        raise RuntimeError(
            f"{type(model).__name__}: expected one nn.ModuleList of {n_layer} blocks, found "
            f"{stacks or 'none'}; repgeom.probes.hf cannot tell where its residual stream is"
        )
    return model.get_submodule(stacks[0])


def _is_norm(module: nn.Module) -> bool:
    # LayerNorm, RMSNorm and the families' own classes (LlamaRMSNorm, MistralRMSNorm, ...).
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith("Norm")


def final_norm_module(model: nn.Module) -> nn.Module | None:
    """The norm the base model applies after its stack of blocks, or None if it has none.

    The rule (module docstring): a normalisation module that is a direct child of the block
    stack's parent or of the base model, and not an embedding norm (BLOOM's
    ``word_embeddings_layernorm`` sits beside its ``ln_f``).

    Raises
    ------
    RuntimeError
        More than one candidate: which one is final cannot be told from the layout.
    """
    stack = block_stack(model)
    stack_name = next(name for name, m in model.named_modules() if m is stack)
    parent = model.get_submodule(stack_name.rpartition(".")[0])
    found: dict[int, tuple[str, nn.Module]] = {}
    for owner in (parent, model):
        for name, child in owner.named_children():
            if _is_norm(child) and "emb" not in name.lower():
                found[id(child)] = (name, child)
    if len(found) > 1:
        names = [name for name, _ in found.values()]
        raise RuntimeError(
            f"{type(model).__name__}: several norms beside the block stack ({names}); "
            "repgeom.probes.hf cannot tell which one is the final norm"
        )
    return next(iter(found.values()))[1] if found else None


class _ResidualRecorder:
    """Hooks that read the last block's output and the final norm's output (checking that the
    final norm reads the last block's output)."""

    def __init__(self, model: nn.Module) -> None:
        self.last_block = block_stack(model)[-1]
        self.norm = final_norm_module(model)
        self.block_out: torch.Tensor | None = None
        self.norm_in: torch.Tensor | None = None
        self.norm_out: torch.Tensor | None = None
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> _ResidualRecorder:
        def block_hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.block_out = output[0] if isinstance(output, tuple) else output

        def norm_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            self.norm_in, self.norm_out = args[0], output

        self.handles.append(self.last_block.register_forward_hook(block_hook))
        if self.norm is not None:
            self.handles.append(self.norm.register_forward_hook(norm_hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def collect(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(last block output, final norm output or None)."""
        if self.block_out is None:
            raise RuntimeError("the forward pass never reached the last block")
        if self.norm is None:
            return self.block_out, None
        if self.norm_out is None:
            raise RuntimeError(f"the forward pass never reached the final norm {self.norm}")
        if self.norm_in is not self.block_out and not torch.equal(self.norm_in, self.block_out):
            raise RuntimeError(
                f"the final norm ({type(self.norm).__name__}) does not read the last block's "
                "output in this model; repgeom.probes.hf does not know its layout"
            )
        return self.block_out, self.norm_out


# --------------------------------------------------------------------------------------------
# Capture


def special_token_ids(tokenizer: Any) -> list[int]:
    """Ids of BOS, EOS, CLS, SEP and PAD (not UNK or MASK, which stand for real text)."""
    ids = {
        getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "cls", "sep", "pad")
    }
    ids.discard(None)
    ids.discard(getattr(tokenizer, "unk_token_id", None))  # some models pad with UNK
    return sorted(ids)


def hf_capture(
    hf: HFModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    attention: bool = True,
    include_special: bool = False,
) -> Capture:
    """Hidden states, queries, keys and attention of a Hugging Face model on a batch.

    For one stack of an encoder-decoder model (``hf.stack``) everything is that stack's: the
    encoder run alone, or the decoder fed the same ids (module docstring), with its
    self-attention only.

    Parameters
    ----------
    hf : HFModel
    input_ids : (B, T) int tensor
    attention_mask : (B, T) tensor, optional
        1 for real tokens, 0 for padding; None means no padding.
    attention : bool
        Also return attention probabilities (B, H, T, T) per layer.
    include_special : bool
        Keep BOS/EOS/CLS/SEP/PAD positions in ``valid`` (excluded by default: they dominate
        some layers). Padding is always excluded.

    Returns
    -------
    Capture
        On the model's device, in its dtype. ``hidden`` is the residual stream before the final
        norm, ``final_norm`` that norm's output (None for post-LN families); see the module
        docstring. ``queries``/``keys`` are empty for families other than gpt2, bert, roberta,
        xlm-roberta-xl, gpt_neox, opt, llama, mistral and t5 (one warning per model).
    """
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
        raise ValueError(
            "input_ids must be a (B, T) integer tensor, "
            f"got {tuple(input_ids.shape)} {input_ids.dtype}"
        )
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                f"{tuple(input_ids.shape)}; they must match"
            )
    model = hf.model
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)

    recorder = _QKRecorder(hf.blocks_owner, hf.family) if hf.has_qk else None
    if recorder is None and not hf._warned_qk:
        warnings.warn(
            f"{hf.name}: model family {hf.family!r} has no query/key hooks in repgeom "
            f"(supported: {', '.join(sorted(_QK_FAMILIES))}); hidden-state and attention "
            "metrics run, query/key metrics are skipped",
            stacklevel=2,
        )
        hf._warned_qk = True

    residual = _residual_recorder(hf)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), residual or contextlib.nullcontext():
            if recorder is not None:
                with recorder:
                    states, attentions = _forward(hf, input_ids, attention_mask, attention)
                queries, keys = recorder.collect()
            else:
                states, attentions = _forward(hf, input_ids, attention_mask, attention)
                queries, keys = [], []
    finally:
        model.train(was_training)
    if residual is None:
        hidden, final_norm = list(states), None
    else:
        # Hugging Face's hidden_states: the embedding output and each block's input; its last
        # entry is the final norm's output in pre-LN models, so it becomes the last block's.
        last_block, final_norm = residual.collect()
        hidden = [*states[:-1], last_block]

    valid = torch.ones_like(input_ids, dtype=torch.bool)  # (B, T)
    if attention_mask is not None:
        valid &= attention_mask.bool()
    special = special_token_ids(hf.tokenizer)
    if not include_special and special:
        valid &= ~torch.isin(input_ids, torch.tensor(special, device=device))
    return Capture(
        hidden=hidden,
        final_norm=final_norm,
        queries=queries,
        keys=keys,
        attention=list(attentions) if attention else [],
        causal=hf.is_decoder,
        valid=valid,
    )


def _residual_recorder(hf: HFModel) -> _ResidualRecorder | None:
    """The hooks reading the residual stream; None (one warning) for an unknown family whose
    blocks or final norm cannot be located, such as ALBERT's shared layer groups."""
    try:
        return _ResidualRecorder(hf.blocks_owner)
    except RuntimeError as error:
        if hf.family in DECODER_FAMILIES | ENCODER_FAMILIES | set(_QK_FAMILIES):
            raise
        if not hf._warned_layout:
            warnings.warn(
                f"{hf.name}: {error}; its hidden states are taken as Hugging Face returns them "
                "(for a pre-LN model the last one is after the final norm) and no final_norm "
                "layer is measured",
                stacklevel=3,
            )
            hf._warned_layout = True
        return None


def _forward(
    hf: HFModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, attention: bool
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """One forward pass of the probed stack: (hidden states, self-attention probabilities).

    For the stacks of an encoder-decoder model (`hf_capture`): the encoder alone on the text;
    the decoder on the same text as ``decoder_input_ids`` (same mask), cross-attending to the
    encoder's output of the same window. Its cross-attention probabilities are not returned.
    """
    model = hf.model
    kwargs: dict[str, Any] = {"output_hidden_states": True, "output_attentions": attention}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # a decoder would otherwise keep every layer's keys and values
    if hf.stack == "encoder":
        kwargs.pop("use_cache", None)
        out = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.hidden_states, out.attentions
    if hf.stack == "decoder":
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=input_ids,
            decoder_attention_mask=attention_mask,
            **kwargs,
        )
        return out.decoder_hidden_states, out.decoder_attentions
    out = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    return out.hidden_states, out.attentions
