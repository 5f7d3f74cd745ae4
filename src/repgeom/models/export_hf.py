"""Export a repgeom checkpoint as a Hugging Face model folder that loads with no repgeom code.

::

    repgeom-export-hf outputs/.../checkpoints/last.ckpt exported/
    python probe.py hf=exported/          # the same numbers as ckpt=...last.ckpt

The folder holds ``config.json``, the weights and a tokenizer; ``AutoModel``,
``AutoModelForCausalLM`` (decoders) and ``AutoTokenizer`` load it offline. Each kind of our
`GPT` maps to the one transformers class that computes exactly the same function (checked to
float32 rounding in ``tests/models/test_export_hf.py``):

==================  =============================  ==========================================
our model           Hugging Face class             why it is exact
==================  =============================  ==========================================
decoder, pre-LN     ``GPT2LMHeadModel``            GPT-2 *is* this layout: learned positions,
(``gpt_*``)                                        pre-LN blocks, ``ln_f``, tied head. Our
                                                   ``nn.Linear`` (out, in) weights become
                                                   GPT-2's ``Conv1D`` (in, out): transposed.
                                                   ``activation_function="gelu"``: the exact
                                                   erf GELU of ``nn.GELU()`` (GPT-2's default
                                                   ``gelu_new`` is the tanh approximation).
encoder, post-LN    ``BertModel``                  BERT's layout: embedding LayerNorm, post-LN
(``bert_small``)                                   blocks, learned positions; the fused
                                                   ``c_attn`` split into query/key/value, the
                                                   one token type's embedding zero.
decoder, post-LN    ``BertModel`` with             the same, with BERT's causal mask.
                    ``is_decoder=True``
encoder, pre-LN     ``XLMRobertaXLModel``          XLM-RoBERTa-XL is pre-LN with no embedding
(``masking=                                        norm and a final ``encoder.LayerNorm``: our
bidirectional``)                                   layout. Its positions start after the pad
                                                   id (fairseq), so a ``[PAD]`` token is added
                                                   at id ``vocab.size`` and our positions are
                                                   stored from row ``vocab.size + 1``.
==================  =============================  ==========================================

Not exact, hence not used: ``RobertaPreLayerNormModel`` (it normalises the embedding, which our
pre-LN model does not) and GPT-2 for encoders (no switch for bidirectional attention). Encoders
are exported without a masked-LM head: BERT's and XLM-RoBERTa-XL's heads add a dense layer, a
GELU and a LayerNorm before the output projection that our tied head does not have. Their
pooler (``tanh(dense(h[:, 0]))``, which we do not have) is stored as zeros, so
``pooler_output`` is zero rather than random. Without biases (``model.bias=false``) the export
is still exact: a LayerNorm or Linear without bias is one with a zero bias.

The tokenizer maps text as our `Vocab` does: UTF-8 bytes, one token per byte, the byte values of
the train split as ids ``0..n-1`` in increasing order, any other byte ``[UNK]``; ``[MASK]`` and
``[UNK]`` (and ``[PAD]`` for the pre-LN encoder) are declared special. It is a ``tokenizers``
BPE model with no merges over GPT-2's printable byte alphabet (`bytes_to_unicode`) behind a
``ByteLevel`` pre-tokenizer, saved through ``PreTrainedTokenizerFast``. It adds no BOS, EOS,
CLS or SEP, and ``split_special_tokens=True`` makes a literal "[MASK]" in the text seven bytes,
as `Vocab.encode` has it, rather than the mask token.

Layer convention: ``output_hidden_states`` of GPT-2 and XLM-RoBERTa-XL ends *after* the final
norm; repgeom's probes (`repgeom.models.hf.hf_capture`) read the residual stream before it and
report the final norm as its own layer, exactly as for the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from repgeom.data.vocab import Vocab
from repgeom.models.gpt import GPT, GPTConfig

PAD = "[PAD]"  # only the pre-LN encoder's export has it (XLM-RoBERTa-XL's position offset)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters.

    Printable Latin-1 bytes map to themselves, the others to code points from 256 on, so every
    byte is one visible character (Radford et al. 2019, ``encoder.py`` of openai/gpt-2; the
    same table as the ``tokenizers`` ``ByteLevel`` pre-tokenizer).
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes), strict=True))


def build_tokenizer(vocab: Vocab, *, model_max_length: int, pad: bool = False) -> Any:
    """A ``PreTrainedTokenizerFast`` giving `vocab`'s ids for any text (see module docstring).

    Parameters
    ----------
    vocab : Vocab
        The checkpoint's vocabulary.
    model_max_length : int
        The model's context (our ``block_size``).
    pad : bool
        Add ``[PAD]`` at id ``vocab.size`` (the pre-LN encoder's export needs a pad id).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbol = bytes_to_unicode()
    tokens = {symbol[b]: i for i, b in enumerate(vocab.byte_values)}
    tokens.update({"[MASK]": vocab.mask_id, "[UNK]": vocab.unk_id})
    if pad:
        tokens[PAD] = vocab.size
    # No merges: BPE leaves one token per (byte-level) character; an unknown one becomes [UNK].
    backend = Tokenizer(models.BPE(vocab=tokens, merges=[], unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        mask_token="[MASK]",
        unk_token="[UNK]",
        pad_token=PAD if pad else None,
        split_special_tokens=True,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


# --------------------------------------------------------------------------------------------
# Weights


def _gpt2(model: GPT) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        activation_function="gelu",  # exact erf GELU, as nn.GELU(); not GPT-2's "gelu_new"
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,  # nn.LayerNorm's default, which our GPT uses
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = GPT2LMHeadModel(config)
    ours = model.state_dict()
    state = {
        "transformer.wte.weight": ours["transformer.wte.weight"],
        "transformer.wpe.weight": ours["transformer.wpe.weight"],
        **_norm(ours, "transformer.ln", "transformer.ln_f"),
    }
    for i in range(c.n_layer):
        block = f"transformer.h.{i}"  # the same names in both models
        state.update(_norm(ours, f"{block}.ln_1", f"{block}.ln_1"))
        state.update(_norm(ours, f"{block}.ln_2", f"{block}.ln_2"))
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            weight, bias = _linear(ours, f"{block}.{name}")
            state[f"{block}.{name}.weight"] = weight.t()  # Conv1D is (in, out), nn.Linear (out, in)
            state[f"{block}.{name}.bias"] = bias
    _load_exactly(hf, state, tied={"lm_head.weight"})
    return hf


def _bert(model: GPT) -> Any:
    from transformers import BertConfig, BertModel

    c = model.config
    config = BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=4 * c.n_embd,
        hidden_act="gelu",  # exact erf GELU
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=c.block_size,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=None,
        is_decoder=c.causal,  # a post-LN decoder: BERT with its causal mask
    )
    hf = BertModel(config)
    ours = model.state_dict()
    state = {
        "embeddings.word_embeddings.weight": ours["transformer.wte.weight"],
        "embeddings.position_embeddings.weight": ours["transformer.wpe.weight"],
        "embeddings.token_type_embeddings.weight": torch.zeros(1, c.n_embd),
        **_norm(ours, "transformer.ln", "embeddings.LayerNorm"),
        **_zero_pooler(c.n_embd),
    }
    for i in range(c.n_layer):
        a, b = f"transformer.h.{i}", f"encoder.layer.{i}"
        state.update(_qkv(ours, f"{a}.attn.c_attn", f"{b}.attention.self", c.n_embd))
        state.update(_linear_state(ours, f"{a}.attn.c_proj", f"{b}.attention.output.dense"))
        state.update(_norm(ours, f"{a}.ln_1", f"{b}.attention.output.LayerNorm"))
        state.update(_linear_state(ours, f"{a}.mlp.c_fc", f"{b}.intermediate.dense"))
        state.update(_linear_state(ours, f"{a}.mlp.c_proj", f"{b}.output.dense"))
        state.update(_norm(ours, f"{a}.ln_2", f"{b}.output.LayerNorm"))
    _load_exactly(hf, state)
    return hf


def _xlm_roberta_xl(model: GPT) -> Any:
    from transformers import XLMRobertaXLConfig, XLMRobertaXLModel

    c = model.config
    pad_id = c.vocab_size  # the added [PAD]; positions are numbered from pad_id + 1
    config = XLMRobertaXLConfig(
        vocab_size=c.vocab_size + 1,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=4 * c.n_embd,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=pad_id + 1 + c.block_size,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=pad_id,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = XLMRobertaXLModel(config)
    ours = model.state_dict()
    wte = ours["transformer.wte.weight"]
    positions = torch.zeros(config.max_position_embeddings, c.n_embd, dtype=wte.dtype)
    positions[pad_id + 1 :] = ours["transformer.wpe.weight"]
    state = {
        "embeddings.word_embeddings.weight": torch.cat([wte, torch.zeros_like(wte[:1])]),
        "embeddings.position_embeddings.weight": positions,
        "embeddings.token_type_embeddings.weight": torch.zeros(1, c.n_embd),
        **_norm(ours, "transformer.ln", "encoder.LayerNorm"),
        **_zero_pooler(c.n_embd),
    }
    for i in range(c.n_layer):
        a, b = f"transformer.h.{i}", f"encoder.layer.{i}"
        state.update(_norm(ours, f"{a}.ln_1", f"{b}.attention.self_attn_layer_norm"))
        state.update(_qkv(ours, f"{a}.attn.c_attn", f"{b}.attention.self", c.n_embd))
        state.update(_linear_state(ours, f"{a}.attn.c_proj", f"{b}.attention.output.dense"))
        state.update(_norm(ours, f"{a}.ln_2", f"{b}.LayerNorm"))
        state.update(_linear_state(ours, f"{a}.mlp.c_fc", f"{b}.intermediate.dense"))
        state.update(_linear_state(ours, f"{a}.mlp.c_proj", f"{b}.output.dense"))
    _load_exactly(hf, state)
    return hf


def _linear(ours: dict, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of one of our Linears; a zero bias where the model has none."""
    weight = ours[f"{name}.weight"]
    bias = ours.get(f"{name}.bias")
    return weight, torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None else bias


def _linear_state(ours: dict, name: str, hf_name: str) -> dict[str, torch.Tensor]:
    weight, bias = _linear(ours, name)
    return {f"{hf_name}.weight": weight, f"{hf_name}.bias": bias}


def _norm(ours: dict, name: str, hf_name: str) -> dict[str, torch.Tensor]:
    weight = ours[f"{name}.weight"]
    bias = ours.get(f"{name}.bias", torch.zeros_like(weight))
    return {f"{hf_name}.weight": weight, f"{hf_name}.bias": bias}


def _qkv(ours: dict, name: str, hf_name: str, n_embd: int) -> dict[str, torch.Tensor]:
    """Our fused ``c_attn`` (rows [q | k | v]) as BERT-style separate query, key, value."""
    weight, bias = _linear(ours, name)
    state = {}
    for part, w, b in zip(
        ("query", "key", "value"), weight.split(n_embd), bias.split(n_embd), strict=True
    ):
        state[f"{hf_name}.{part}.weight"] = w
        state[f"{hf_name}.{part}.bias"] = b
    return state


def _zero_pooler(n_embd: int) -> dict[str, torch.Tensor]:
    return {
        "pooler.dense.weight": torch.zeros(n_embd, n_embd),
        "pooler.dense.bias": torch.zeros(n_embd),
    }


def _load_exactly(hf: torch.nn.Module, state: dict, tied: set[str] = frozenset()) -> None:
    """Load `state` into `hf`; every parameter must be given (bar tied ones), every shape match."""
    expected = set(hf.state_dict())
    missing = expected - set(state) - set(tied)
    unexpected = set(state) - expected
    if missing or unexpected:
        raise RuntimeError(
            f"{type(hf).__name__}: the export maps no weight to {sorted(missing)} and maps "
            f"{sorted(unexpected)} to nothing; this transformers version names its weights "
            "differently from what repgeom.models.export_hf expects"
        )
    hf.load_state_dict({k: v.detach().clone().contiguous() for k, v in state.items()}, strict=False)


# --------------------------------------------------------------------------------------------
# The export


@dataclass(frozen=True)
class ExportTarget:
    """One Hugging Face family our models are exported as (the table in the module docstring).

    family : its ``model_type``, a record of `repgeom.models.hf.families.FAMILIES` (how the
        exported folder is read back).
    hf_class : the transformers class. build : our `GPT` -> that class, weights copied.
    pad : whether the tokenizer gets ``[PAD]`` (XLM-RoBERTa-XL's position offset needs one).
    """

    family: str
    hf_class: str
    build: Callable[[GPT], Any]
    pad: bool = False


EXPORT_TARGETS = {
    "decoder, pre-LN": ExportTarget("gpt2", "GPT2LMHeadModel", _gpt2),
    "post-LN": ExportTarget("bert", "BertModel", _bert),
    "encoder, pre-LN": ExportTarget("xlm-roberta-xl", "XLMRobertaXLModel", _xlm_roberta_xl,
                                    pad=True),
}


def export_target(config: GPTConfig) -> ExportTarget:
    """The family a model with `config` is exported as (module docstring)."""
    if config.norm == "post":
        return EXPORT_TARGETS["post-LN"]
    return EXPORT_TARGETS["decoder, pre-LN" if config.causal else "encoder, pre-LN"]


def to_hf(model: GPT) -> Any:
    """The transformers model computing exactly what `model` computes, in eval mode."""
    with torch.no_grad():
        hf = export_target(model.config).build(model.float())
    return hf.eval()


def export_hf(ckpt_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the checkpoint at `ckpt_path` as a ``save_pretrained`` folder `out_dir`.

    Parameters
    ----------
    ckpt_path : path
        A checkpoint written by ``train.py``.
    out_dir : path
        The folder to write (created; files of an earlier export in it are replaced).

    Returns
    -------
    Path
        `out_dir`, ready for ``AutoModel.from_pretrained`` / ``python probe.py hf=<out_dir>``.

    Raises
    ------
    FileNotFoundError, repgeom.models.checkpoints.CheckpointFormatError
        A missing file or one that is not a repgeom checkpoint.
    """
    from repgeom.models.checkpoints import read_checkpoint
    from repgeom.models.lightning_module import CharLM

    read_checkpoint(ckpt_path)  # a clear error for a missing or foreign file
    module = CharLM.load_from_checkpoint(ckpt_path, map_location="cpu", weights_only=True)
    model = module.model.eval()
    hf = to_hf(model)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    tokenizer = build_tokenizer(
        module.vocab,
        model_max_length=model.config.block_size,
        pad=export_target(model.config).pad,
    )
    tokenizer.save_pretrained(out)
    return out
