"""What the Hugging Face tests share: the tiny families with Q/K hooks, a padded batch, and the
attention recomputed from captured queries and keys."""

from __future__ import annotations

import math

import torch

from repgeom.models.hf import tokenize_windows

QK_FAMILIES = ["gpt2", "gpt2-scaled", "bert", "roberta", "xlm-roberta-xl", "gpt_neox", "opt",
               "llama", "mistral"]  # fmt: skip
DECODERS = {"gpt2", "gpt2-scaled", "gpt_neox", "opt", "llama", "mistral"}
WINDOW = 12


def padded_batch(hf, text):
    """Two windows; the second right-padded over its last 4 positions."""
    ids, mask = tokenize_windows(hf, text, window=WINDOW, n_windows=2)
    mask[1, -4:] = 0
    if hf.tokenizer.pad_token_id is not None:
        ids[1, -4:] = hf.tokenizer.pad_token_id
    return ids, mask


def reproduce_attention(cap, mask, causal):
    """softmax(Q Kᵀ/√D + mask) per layer, from the captured queries and keys."""
    T = mask.size(1)
    allowed = mask.bool()[:, None, None, :].to(cap.queries[0].device)  # (B, 1, 1, T)
    if causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=allowed.device).tril()
    probs = []
    for q, k in zip(cap.queries, cap.keys, strict=True):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
        probs.append(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
    return probs
