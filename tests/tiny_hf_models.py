"""Tiny random Hugging Face models of every family repgeom reads, written with no download.

`build_tiny_hf(family, folder)` writes a 2-layer model of that family with `save_pretrained` and
a character-level tokenizer (a `tokenizers` BPE model with no merges, wrapped in
`PreTrainedTokenizerFast`) whose special tokens and template copy the real family's: CLS ... SEP
for BERT and ELECTRA, <s> ... </s> for RoBERTa, BOS first for Llama/Mistral, Gemma, Phi-3 and OPT
(whose BOS is "</s>"), EOS last for T5, nothing for GPT-2, GPT-NeoX, BLOOM, OLMo, Qwen, SmolLM3
and Falcon (whose real tokenizers may differ: the tokens only decide which positions count).
The shared fixture `tiny_hf_folder` (tests/conftest.py) and the analyses' tests build their
models with it.
"""

from __future__ import annotations

import torch

CHARS = list("abcdefghijklmnopqrstuvwxyz .,;:'\n")
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "[CLS]", "[SEP]", "<|endoftext|>"]
VOCAB = {t: i for i, t in enumerate(SPECIALS + CHARS)}

TEXT = (
    "the quick brown fox jumps over the lazy dog, and then it sleeps. "
    "a character level tokenizer turns every letter into one token; "
    "so this text is a few hundred tokens long, enough for several windows.\n"
) * 2

# family -> (config class, config kwargs, tokenizer special tokens, single-sequence template)
_SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64
)
_BERTLIKE = dict(_SMALL, intermediate_size=64)
_LLAMALIKE = dict(_SMALL, intermediate_size=64)
_ROBERTALIKE = (
    dict(_BERTLIKE, max_position_embeddings=66, pad_token_id=0, bos_token_id=2, eos_token_id=3),
    dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
         pad_token="<pad>", unk_token="<unk>"),
    "<s> $A </s>",
)
"""Config, special tokens and template shared by RoBERTa and XLM-RoBERTa-XL."""
_EOS_ONLY = dict(eos_token="<|endoftext|>", pad_token="<pad>", unk_token="<unk>")
"""OLMo, Qwen, SmolLM3 and Falcon tokenizers add no special token to a text."""
_GEMMA_IDS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
_GEMMA_TOKENS = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
_FALCON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, bos_token_id=6,
               eos_token_id=6)
FAMILIES = {
    "gpt2": (
        "GPT2Config",
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=6, eos_token_id=6),
        dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<unk>"),
        None,
    ),
    # GPT-2 variant whose scores are not scaled by 1/sqrt(D) alone: Q must absorb 1/(layer+1).
    "gpt2-scaled": (
        "GPT2Config",
        dict(
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            scale_attn_by_inverse_layer_idx=True,
            bos_token_id=6,
            eos_token_id=6,
        ),
        dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<unk>"),
        None,
    ),
    "bert": (
        "BertConfig",
        dict(_BERTLIKE, pad_token_id=0),
        dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>", unk_token="<unk>"),
        "[CLS] $A [SEP]",
    ),
    # RoBERTa numbers positions from pad_token_id + 1, hence two extra positions.
    "roberta": ("RobertaConfig", *_ROBERTALIKE),
    # Pre-LN encoder: no embedding norm, a norm before each sublayer, a final encoder.LayerNorm.
    "xlm-roberta-xl": ("XLMRobertaXLConfig", *_ROBERTALIKE),
    "gpt_neox": (
        "GPTNeoXConfig",
        # rotary_pct < 1 as in Pythia (0.25): only part of each head's dims is rotated.
        dict(_SMALL, intermediate_size=64, rotary_pct=0.5, bos_token_id=6, eos_token_id=6),
        dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<unk>"),
        None,
    ),
    # ALiBi instead of learned or rotary positions: no max_position_embeddings. BLOOM's
    # tokenizer adds no special tokens; its <pad>, <s>, </s> are the config's ids.
    "bloom": (
        "BloomConfig",
        dict(hidden_size=32, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=2, eos_token_id=3),
        dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
        None,
    ),
    "opt": (
        "OPTConfig",
        dict(
            _SMALL,
            ffn_dim=64,
            word_embed_proj_dim=32,
            pad_token_id=0,
            bos_token_id=3,
            eos_token_id=3,
        ),
        dict(bos_token="</s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
        "</s> $A",
    ),
    # OPT-350m's layout: post-LN blocks and no final norm (do_layer_norm_before=False).
    "opt-post": (
        "OPTConfig",
        dict(
            _SMALL,
            ffn_dim=64,
            word_embed_proj_dim=32,
            do_layer_norm_before=False,
            pad_token_id=0,
            bos_token_id=3,
            eos_token_id=3,
        ),
        dict(bos_token="</s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
        "</s> $A",
    ),
    "llama": (
        "LlamaConfig",
        dict(_LLAMALIKE, num_key_value_heads=2, bos_token_id=2, eos_token_id=3),
        dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        "<s> $A",
    ),
    "mistral": (
        "MistralConfig",
        dict(_LLAMALIKE, num_key_value_heads=1, bos_token_id=2, eos_token_id=3),
        dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        "<s> $A",
    ),
    # Mistral's sliding window on every layer, without layer_types (config.sliding_window alone).
    "mistral-sw": (
        "MistralConfig",
        dict(_LLAMALIKE, num_key_value_heads=1, bos_token_id=2, eos_token_id=3, sliding_window=4),
        dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
        "<s> $A",
    ),
    # Encoder-decoder, probed as two models; decoder deeper than encoder so that a layer taken
    # from the wrong stack shows in the layer count.
    "t5": (
        "T5Config",
        dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
             pad_token_id=0, eos_token_id=3, decoder_start_token_id=0),
        dict(eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
        "$A </s>",
    ),
    # The families read at the product (`repgeom.models.hf.qk`). Each exercises what sets it
    # apart: OLMo's clip_qkv clamp, OLMo-2/3's QK-norm over the whole projection (and OLMo-3's
    # sliding-window layers), Qwen2's q/k biases, Qwen3's per-head QK-norm, Gemma's head_dim
    # apart from hidden/heads, Gemma 2's soft-cap and query_pre_attn_scalar, Gemma 3's per-head
    # QK-norm and local/global layers, Phi-3's fused qkv_proj with partial rotary, SmolLM3's
    # NoPE layer, and Falcon's three layouts of query_key_value.
    "olmo": ("OlmoConfig", dict(_LLAMALIKE, num_key_value_heads=2, clip_qkv=0.5, pad_token_id=0,
                                eos_token_id=6), _EOS_ONLY, None),
    "olmo2": ("Olmo2Config", dict(_LLAMALIKE, num_key_value_heads=2, pad_token_id=0,
                                  eos_token_id=6), _EOS_ONLY, None),
    "olmo3": ("Olmo3Config", dict(_LLAMALIKE, num_key_value_heads=2, pad_token_id=0,
                                  eos_token_id=6, sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"]),
              _EOS_ONLY, None),
    "qwen2": ("Qwen2Config", dict(_LLAMALIKE, num_key_value_heads=2, eos_token_id=6), _EOS_ONLY,
              None),
    # Qwen2 with use_sliding_window: layers from max_window_layers on slide.
    "qwen2-sw": ("Qwen2Config", dict(_LLAMALIKE, num_key_value_heads=2, eos_token_id=6,
                                     use_sliding_window=True, sliding_window=4,
                                     max_window_layers=1), _EOS_ONLY, None),
    "qwen3": ("Qwen3Config", dict(_LLAMALIKE, num_key_value_heads=2, head_dim=8, eos_token_id=6),
              _EOS_ONLY, None),
    "gemma": ("GemmaConfig", dict(_LLAMALIKE, num_key_value_heads=1, head_dim=16, **_GEMMA_IDS),
              _GEMMA_TOKENS, "<s> $A"),
    "gemma2": ("Gemma2Config", dict(_LLAMALIKE, num_key_value_heads=2, head_dim=8,
                                    query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                    sliding_window=4, **_GEMMA_IDS),
               _GEMMA_TOKENS, "<s> $A"),
    "gemma3_text": ("Gemma3TextConfig", dict(_LLAMALIKE, num_key_value_heads=2, head_dim=8,
                                             query_pre_attn_scalar=16, sliding_window=4,
                                             layer_types=["sliding_attention", "full_attention"],
                                             **_GEMMA_IDS),
                    _GEMMA_TOKENS, "<s> $A"),
    # EmbeddingGemma's layout: Gemma 3 with bidirectional attention (windows |t - j| < W).
    "gemma3_text-bidirectional": (
        "Gemma3TextConfig", dict(_LLAMALIKE, num_key_value_heads=2, head_dim=8,
                                 query_pre_attn_scalar=16, sliding_window=4,
                                 layer_types=["sliding_attention", "full_attention"],
                                 use_bidirectional_attention=True, **_GEMMA_IDS),
        _GEMMA_TOKENS, "<s> $A"),
    "phi3": ("Phi3Config", dict(_LLAMALIKE, num_key_value_heads=2, pad_token_id=0, bos_token_id=2,
                                eos_token_id=3, rope_parameters=dict(
                                    rope_type="default", rope_theta=10000.0,
                                    partial_rotary_factor=0.5)),
             dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"),
             "<s> $A"),
    "smollm3": ("SmolLM3Config", dict(_LLAMALIKE, num_key_value_heads=2, no_rope_layers=[1, 0],
                                      pad_token_id=0, bos_token_id=6, eos_token_id=6),
                _EOS_ONLY, None),
    # Falcon-40B/180B: grouped queries per key head (new_decoder_architecture).
    "falcon": ("FalconConfig", dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2),
               _EOS_ONLY, None),
    # Falcon-7B: one key head for all queries (multi_query).
    "falcon-mq": ("FalconConfig", dict(_FALCON, multi_query=True), _EOS_ONLY, None),
    # Falcon-RW: a head per key, ALiBi on the scores instead of rotary, biases.
    "falcon-rw": ("FalconConfig", dict(_FALCON, multi_query=False, alibi=True, bias=True,
                                       parallel_attn=False), _EOS_ONLY, None),
    # A family without query/key hooks in repgeom.
    "electra": (
        "ElectraConfig",
        dict(_BERTLIKE, embedding_size=32, pad_token_id=0),
        dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="<pad>", unk_token="<unk>"),
        "[CLS] $A [SEP]",
    ),
}


def build_tiny_hf(family: str, folder, *, tokenizer: bool = True) -> None:
    """Write a tiny random `family` model and (unless not `tokenizer`) its tokenizer to `folder`.

    Without the tokenizer the folder is what ``model.save_pretrained`` alone writes.
    """
    import transformers
    from tokenizers import Tokenizer, models, processors
    from transformers import AutoModel, PreTrainedTokenizerFast

    config_cls, config_kwargs, special_tokens, template = FAMILIES[family]
    config = getattr(transformers, config_cls)(vocab_size=len(VOCAB), **config_kwargs)
    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    # Transformers' init (std 0.02, zero biases) makes attention almost uniform, so a wrong query
    # or key would hardly change it; large random weights and biases make every check sharp.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    if not tokenizer:
        return

    backend = Tokenizer(models.BPE(vocab=VOCAB, merges=[], unk_token="<unk>"))  # one token per char
    if template is not None:
        used = sorted({t for t in template.split() if t in VOCAB})
        backend.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(t, VOCAB[t]) for t in used]
        )
    PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens).save_pretrained(folder)
