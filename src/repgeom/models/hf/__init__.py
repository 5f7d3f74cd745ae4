"""Hugging Face models read like our GPT: load one, cut text into windows, capture its states.

One job per module: `loading` (`load_hf_model`, `HFModel`, tokenizers), `families` (one record
per known family: decoder or not, where its queries and keys are; adding a family is one entry
there), `windows` (text to token windows), `qk` (the query/key hooks), `residual` (block stack
and final norm hooks), `stacks` (the two stacks of T5/ByT5), `capture` (`hf_capture`). The
hub itself (calls, downloads, the shared cache, revisions) is `repgeom.models.hub`'s.


`hf_capture` fills the same `Capture` as our own `GPT.capture()`, so every probe reads one format:

- hidden states: the residual stream, as `GPT.capture()` returns it: the embedding output at
  index 0 and the output of every block, *before* any final norm. Hugging Face's
  `output_hidden_states` gives the embedding output and the input of every block, but for
  pre-LN models (GPT-2, GPT-NeoX, BLOOM, OPT, Llama, Mistral, XLM-RoBERTa-XL) its last entry is
  the final norm's output; so the last entry is replaced by the last block's output, read with a
  forward hook on that block.
- final norm: the output of the norm the base model applies after its stack of blocks
  (``Capture.final_norm``, probed as its own layer ``final_norm``). The rule that finds it: the
  stack of blocks is the ``nn.ModuleList`` with ``num_hidden_layers`` entries; the final norm is
  the normalisation module (a ``LayerNorm``/``RMSNorm``, by class name) that is a direct child
  of the stack's parent or of the base model itself, outside the embeddings: GPT-2 ``ln_f``,
  GPT-NeoX ``final_layer_norm``, BLOOM ``ln_f``, OPT ``decoder.final_layer_norm`` (absent for
  post-LN OPT configs), Llama/Mistral ``norm``, XLM-RoBERTa-XL ``encoder.LayerNorm``. BLOOM's
  ``word_embeddings_layernorm`` is part of its embedding output (index 0), not a final norm.
  BERT, RoBERTa and ELECTRA (post-LN) have none. A hook checks on every pass that the module's
  input is the last block's output, so a family laid out differently fails loudly instead of
  being mismeasured.
- attention probabilities: `output_attentions`; the model is loaded with eager attention, the only
  implementation that materialises them.
- queries and keys: forward hooks on the attention projections of the first families below,
  or the arguments of their attention function for the others (`repgeom.models.hf.qk`), split into
  heads, rotated by the model's own rotary function where the family uses one, and with
  grouped-query key heads repeated to the number of query heads. A "query" is defined so that
  ``softmax(Q @ K.T / sqrt(D) + bias + mask)`` is exactly the model's attention, where ``bias``
  is the family's position bias on the scores (T5's relative bias, BLOOM's ALiBi; none for the
  others). Where a model scales its scores by something other than 1/sqrt(D) (GPT-2's
  ``scale_attn_by_inverse_layer_idx``), the extra factor is folded into Q. OPT multiplies the
  output of ``q_proj`` by 1/sqrt(D) before the product; our Q is the unscaled ``q_proj``
  output, as for every other family.

  ==============  =============================  ==============================================
  family          hooked modules                 queries and keys
  ==============  =============================  ==============================================
  gpt2            ``attn.c_attn`` (Conv1D)       q, k, v = split of the fused output
  bert,           ``attention.self.query/.key``  the two Linear outputs
  roberta,
  xlm-roberta-xl
  gpt_neox        ``attention.query_key_value``  per head [q | k | v] interleaved, then rotary on
                                                 the first ``rotary_pct`` of each head's dims
  bloom           ``query_key_value`` (of        per head [q | k | v] interleaved (BLOOM's
                  ``self_attention``)            ``view(B, T, H, 3, D)``); no position in Q or
                                                 K: its ALiBi bias is added to the scores
  opt             ``self_attn.q_proj/.k_proj``   the two Linear outputs (before OPT's scaling)
  llama,          ``self_attn.q_proj/.k_proj``   rotary, then KV heads repeated (grouped-query)
  mistral
  t5 (ByT5)       ``SelfAttention.q/.k``         the two Linear outputs, times sqrt(D): T5 does
                                                 not scale its scores (``scaling = 1``); its
                                                 relative position bias, added to the scores, is
                                                 not part of Q K^T (cross-attention not hooked)
  olmo, olmo2,    the attention function's       the ``query`` and ``key`` the module passes to
  olmo3, qwen2,   arguments (at the product:     its eager attention, after its QK-norm, clamp,
  qwen3, gemma,   ``repgeom.models.hf.qk``)      bias, fused split and rotary; its ``scaling``
  gemma2,                                        folded into Q (Gemma 2/3's
  gemma3_text,                                   ``query_pre_attn_scalar``); Gemma 2's soft-cap
  phi3, smollm3,                                 is applied after the product, not in Q K^T;
  falcon                                         Falcon-RW's ALiBi is on the scores
  ==============  =============================  ==============================================

  docs/probing.md has the same table with what sets each family apart.

  The rotary cos/sin are read from the attention module's ``position_embeddings`` argument (a
  forward pre-hook with ``with_kwargs=True``) and applied with ``apply_rotary_pos_emb`` from the
  family's own modeling module, so partial rotary (Pythia) and scaled RoPE variants are exactly
  the model's. Any other family still gets hidden states and attention; its queries and keys are
  left empty with one warning per loaded model.

  ALiBi (BLOOM) is a bias on the scores, not a rotation of Q and K, so it stays out of them, as
  T5's relative bias does: the query/key metrics (`repgeom.metrics.qk_alignment`,
  ``qk_cosine_concat``, `repgeom.metrics.attention_scores`) read the content part q·k/√D of
  the score. The model's attention is ``softmax(Q K^T/sqrt(D) + m_h j + mask)`` for query
  position t and key position j (``BloomModel`` builds ``m_h j`` from the attention mask, j
  counting real tokens only, with ``beta = 1``), and since ``m_h j`` differs from the ALiBi
  paper's ``-m_h (t - j)`` by a constant per query row, both give the same softmax; the slope
  of head h (from 0) is ``m_h = 2^(-8 (h+1) / H)`` for a power-of-two H. BLOOM's
  ``inv_norm_factor`` is 1/sqrt(D), so its Q is the unscaled fused output.

Encoder or decoder is read from the config (``is_decoder``, the family name, then the
architecture names such as ``*ForCausalLM`` / ``*ForMaskedLM``); when the config says nothing,
one tiny forward pass decides: a decoder's early positions do not change when a later token does.

Encoder-decoder models (``is_encoder_decoder``: T5, ByT5) are probed as two models, one per
stack (``HFModel.stack``), each with its own embedding, blocks and final norm (T5's
``final_layer_norm`` in both stacks, measured as the layer ``final_norm`` as above):

the encoder alone on the text's windows, and the decoder reading the same window causally while
cross-attending to the encoder (`repgeom.models.hf.stacks` says how and why).
"""

from __future__ import annotations

from repgeom.models.hf.capture import hf_capture
from repgeom.models.hf.loading import (
    HFModel,
    TokenizerMissingError,
    load_hf_model,
    load_tokenizer_or_explain,
    model_stacks,
)
from repgeom.models.hf.stacks import STACKS
from repgeom.models.hf.windows import special_token_ids, tokenize_windows

__all__ = [
    "STACKS",
    "HFModel",
    "TokenizerMissingError",
    "hf_capture",
    "load_hf_model",
    "load_tokenizer_or_explain",
    "model_stacks",
    "special_token_ids",
    "tokenize_windows",
]
