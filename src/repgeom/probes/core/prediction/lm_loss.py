"""The model's own loss on the probe's windows, beside the geometry: rows ``lm_loss`` and
``bpc`` of every probed step, and each probed state's surprisal.

Cheng et al. (ICLR 2025) and Viswanathan et al. (2025) read the intrinsic dimension against
what the model predicts; these rows put the loss in the same table, on the same windows, at the
same step:

- **decoders** (ours and Hugging Face's causal models, and T5's decoder as `hf_capture` runs
  it): the next token's surprisal ``-log p(x_{p+1} | x_{<=p})`` at every sampled state position
  ``p`` of the state probe set, from the head applied to the final states the capture already
  holds (no second forward pass; the last position of a window, with no next token inside it,
  has none);
- **encoders** (ours): the masked-character loss of training validation (`Masking`:
  `repgeom.data.masking.mlm_mask` with the run's masking options and the probe's seed, over
  every probe window at once), from one more forward pass of the masked windows: the loss needs
  inputs the probe's states do not see.

Rows (`MODEL_LAYER`: not a layer of the model, its output): ``lm_loss`` the mean surprisal in
nats per predicted token, ``bpc`` the same in bits per character, a character being a UTF-8
byte as in enwik8 (ours: one token is one byte; Hugging Face models: bits over the bytes of the
text the predicted tokens cover, from the tokenizer's offsets,
`repgeom.models.hf.windows.window_characters`, so an export of ours reads the same); ``std`` is
the standard error of the mean over the predicted tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from repgeom.data.masking import IGNORE_INDEX, mlm_mask
from repgeom.probes.core.table import MODEL_LAYER, MODEL_LAYER_NAME, MODEL_METRICS


@dataclass(frozen=True)
class Masking:
    """An encoder's masking (`repgeom.data.masking.mlm_mask`), as training validation masks."""

    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    mask_prob: float
    replace_prob: float
    random_prob: float

    @classmethod
    def of(cls, vocab: Any, masking: Mapping[str, Any]) -> Masking:
        """From a run's vocabulary (`repgeom.data.vocab.Vocab`) and its ``masking`` options."""
        return cls(int(vocab.mask_id), int(vocab.size), tuple(int(i) for i in vocab.special_ids),
                   float(masking["mask_prob"]), float(masking["replace_prob"]),
                   float(masking["random_prob"]))

    def apply(self, windows: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of `windows` (N, T), drawn at once on the CPU from `seed`: what
        ``CharLM._loss`` gives those windows with ``generator_seed=seed``."""
        generator = torch.Generator().manual_seed(int(seed))
        return mlm_mask(windows.cpu(), mask_id=self.mask_id, vocab_size=self.vocab_size,
                        special_ids=self.special_ids, mask_prob=self.mask_prob,
                        replace_prob=self.replace_prob, random_prob=self.random_prob,
                        generator=generator)


@dataclass
class TokenLoss:
    """Per-token surprisals of one probe step.

    surprisal : (S,) float64, nats; NaN where a state has no target (the last position of a
        window under next-token prediction)
    characters : (S,) float64 or None, the characters (UTF-8 bytes) of the text each predicted
        token covers (None: one each)
    per_state : True when row i is the i-th probed state (decoders), False when the rows are
        the masked positions of an encoder's windows
    """

    surprisal: np.ndarray
    characters: np.ndarray | None = None
    per_state: bool = True

    def rows(self) -> list[dict]:
        """The ``lm_loss`` and ``bpc`` rows (none when no token has a target)."""
        known = np.isfinite(self.surprisal)
        values = self.surprisal[known]
        if not values.size:
            return []
        n = values.size
        mean = float(values.mean())
        sem = float(values.std() / math.sqrt(n)) if n > 1 else math.nan
        chars = (float(n) if self.characters is None
                 else float(self.characters[known].sum()))
        per_char = n / chars if chars > 0 else math.nan  # tokens per character
        loss, bpc = MODEL_METRICS
        rows = [(loss, mean, sem),
                (bpc, mean / math.log(2) * per_char, sem / math.log(2) * per_char)]
        return [{"layer": MODEL_LAYER, "layer_name": MODEL_LAYER_NAME, "head": -1,
                 "metric": name, "value": value, "std": std} for name, value, std in rows]


def next_token_targets(windows: torch.Tensor, positions: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of every marked position, in the order the states come (window order,
    then position order: `GPT.capture_positions`), and whether it lies inside the window.

    Returns (targets (S,) int64, has (S,) bool); a target without a next token is 0."""
    window, position = positions.cpu().nonzero(as_tuple=True)
    has = position + 1 < windows.shape[1]
    following = (position + 1).clamp_max(windows.shape[1] - 1)
    return windows.cpu()[window, following], has


def head_surprisal(head: Callable[[torch.Tensor], torch.Tensor], final: torch.Tensor,
                   targets: torch.Tensor, has: torch.Tensor, *, chunk: int = 4096) -> np.ndarray:
    """``-log softmax(head(final))[target]`` per row of `final` (S, C), in nats; NaN where not
    `has`. In chunks of `chunk` rows, so the logits of a large vocabulary stay small."""
    out = np.full(len(targets), math.nan)
    with torch.no_grad():
        for start in range(0, len(targets), chunk):
            rows = slice(start, start + chunk)
            logits = head(final[rows]).float()
            target = targets[rows].to(logits.device)
            nats = F.cross_entropy(logits, target, reduction="none").double().cpu().numpy()
            out[rows] = np.where(has[rows].numpy(), nats, math.nan)
    return out


def gpt_state_loss(model: Any, capture: Any, windows: torch.Tensor,
                   positions: torch.Tensor) -> TokenLoss:
    """A decoder's next-character surprisal at each probed state, from the final states of
    `capture` (`GPT.capture_positions`): ``lm_head`` of the final norm's output (pre-LN) or of
    the last block's (post-LN), what `GPT.forward` applies."""
    final = capture.final_norm if capture.final_norm is not None else capture.hidden[-1]
    targets, has = next_token_targets(windows, positions)
    return TokenLoss(head_surprisal(model.lm_head, final.reshape(-1, final.shape[-1]),
                                    targets, has))


def gpt_masked_loss(model: Any, windows: torch.Tensor, masking: Masking, *, seed: int,
                    batch_size: int) -> TokenLoss:
    """An encoder's masked-character surprisal at every masked position of `windows`
    (`Masking.apply` with `seed`), one forward pass of the masked windows."""
    inputs, targets = masking.apply(windows, seed)
    device = next(model.parameters()).device
    parts = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            logits = model(inputs[start : start + batch_size].to(device)).float()
            target = targets[start : start + batch_size].to(device)
            nats = F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                   ignore_index=IGNORE_INDEX, reduction="none")
            parts.append(nats[target.flatten() != IGNORE_INDEX].double().cpu())
    return TokenLoss(torch.cat(parts).numpy(), per_state=False)


def hf_targets(windows: torch.Tensor, valid: torch.Tensor, mask: torch.Tensor | None,
               characters: torch.Tensor | None, special: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(targets, has, characters) of the probed states `valid` of Hugging Face `windows`: the
    next token (`next_token_targets`), whether it is one to predict (inside the window, a real
    token of `mask`, not one of the `special` ids: a BOS/EOS/SEP the tokenizer adds is no text),
    and the characters of the text it covers (`characters` at it; NaN where None)."""
    valid = valid.cpu()
    windows = windows.cpu()
    targets, has = next_token_targets(windows, valid)
    window, position = valid.nonzero(as_tuple=True)
    nxt = (window, (position + 1).clamp_max(windows.shape[1] - 1))
    if mask is not None:
        has &= mask.bool().cpu()[nxt]
    has &= ~torch.isin(targets, special.to(targets.dtype))
    chars = (np.full(len(targets), math.nan) if characters is None
             else characters.cpu()[nxt].double().numpy())
    return targets, has, chars


class HFLoss:
    """A Hugging Face decoder's next-token surprisal at the probed states, batch by batch of
    `hf_capture`: its head (`repgeom.models.hf.lm_head`) on the captured final states, checked
    once against the model's own logits (`check_head`; a mismatch leaves the rows out, warned).
    A state's target is the next token when it is a real, ordinary token of the window (mask 1,
    not a special token: `hf_targets`); the characters (UTF-8 bytes) of the text each target
    covers (the tokenizer's offsets, `repgeom.models.hf.windows.window_characters`) make
    ``bpc``, NaN where the tokenizer has no offsets (warned)."""

    def __init__(self, hf: Any) -> None:
        from repgeom.models.hf.lm_head import head_of
        from repgeom.models.hf.windows import special_token_ids

        self.hf, self.head = hf, head_of(hf.lm)
        self.special = torch.tensor(special_token_ids(hf.tokenizer), dtype=torch.long)
        self.parts: list[np.ndarray] = []
        self.chars: list[np.ndarray] = []
        self.warnings: list[str] = []
        self.checked = False

    @classmethod
    def of(cls, hf: Any) -> HFLoss | None:
        """The loss of a decoder loaded with its head; None otherwise (an encoder's:
        `hf_masked_loss`)."""
        if getattr(hf, "lm", None) is None or not getattr(hf, "is_decoder", True):
            return None
        return cls(hf)

    def add(self, capture: Any, windows: torch.Tensor, mask: torch.Tensor | None,
            characters: torch.Tensor | None = None) -> None:
        """The surprisals of one batch's probed states (`capture.valid`) at their next tokens;
        `characters` (windows' shape): what each token covers of the text."""
        if self.head is None:
            return
        final = capture.final_norm if capture.final_norm is not None else capture.hidden[-1]
        if not self.checked:
            from repgeom.models.hf.lm_head import check_head

            device = final.device
            why = check_head(self.hf.lm, self.head, final, windows.to(device),
                             None if mask is None else mask.to(device))
            self.checked = True
            if why:
                self.warnings.append(f"{self.hf.name}: no lm_loss rows: {why}")
                self.head = None
                return
        valid = capture.valid.cpu()
        targets, has, chars = hf_targets(windows, valid, mask, characters, self.special)
        if characters is None and not self.chars:
            self.warnings.append(f"{self.hf.name}: its tokenizer gives no offset mapping (not a "
                                 "fast tokenizer): bpc is NaN, lm_loss is written")
        rows = final[valid.to(final.device)]
        self.parts.append(head_surprisal(self.head, rows, targets, has))
        self.chars.append(chars)

    def result(self) -> TokenLoss | None:
        if self.head is None or not self.parts:
            return None
        return TokenLoss(np.concatenate(self.parts), np.concatenate(self.chars))


HF_MASK_PROB = 0.15
"""Share of a Hugging Face encoder's ordinary tokens masked for its loss rows (BERT's 15%)."""


def hf_mlm_mask(windows: torch.Tensor, mask: torch.Tensor | None, special: torch.Tensor,
                mask_id: int, seed: int, mask_prob: float = HF_MASK_PROB
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of an encoder's masked-LM loss on `windows`: `mask_prob` of the ordinary
    tokens (real, not `special`), drawn on the CPU from `seed`, replaced by `mask_id`; labels
    are the original tokens there, ``IGNORE_INDEX`` elsewhere. Every chosen token is masked (no
    random or kept ones): the evaluation form of BERT's masking (Devlin et al. 2019, 3.1)."""
    windows = windows.cpu()
    ordinary = torch.ones_like(windows, dtype=torch.bool) if mask is None else mask.bool().cpu()
    ordinary &= ~torch.isin(windows, special.to(windows.dtype))
    generator = torch.Generator().manual_seed(int(seed))
    chosen = (torch.rand(windows.shape, generator=generator) < mask_prob) & ordinary
    inputs = torch.where(chosen, torch.full_like(windows, int(mask_id)), windows)
    labels = torch.where(chosen, windows, torch.full_like(windows, IGNORE_INDEX))
    return inputs, labels


def hf_masked_loss(hf: Any, windows: torch.Tensor, mask: torch.Tensor | None,
                   characters: torch.Tensor | None, *, seed: int, batch_size: int
                   ) -> tuple[TokenLoss | None, str]:
    """A Hugging Face encoder's masked-token surprisal (`hf_mlm_mask` with the probe's `seed`),
    from one more forward pass of the masked windows through its ``AutoModelForMaskedLM``
    (`HFModel.lm`); the characters (UTF-8 bytes) of the masked tokens make ``bpc``. (None,
    why) when it has no head or its tokenizer no mask token."""
    from repgeom.models.hf.windows import special_token_ids

    if getattr(hf, "lm", None) is None or getattr(hf, "is_decoder", False):
        return None, ""
    mask_id = getattr(hf.tokenizer, "mask_token_id", None)
    if mask_id is None:
        return None, f"{hf.name}: its tokenizer has no mask token: no lm_loss rows"
    special = torch.tensor(special_token_ids(hf.tokenizer), dtype=torch.long)
    inputs, labels = hf_mlm_mask(windows, mask, special, mask_id, seed)
    device = next(hf.lm.parameters()).device
    parts = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            rows = slice(start, start + batch_size)
            logits = hf.lm(input_ids=inputs[rows].to(device), attention_mask=None if mask is None
                           else mask[rows].to(device)).logits.float()
            target = labels[rows].to(device)
            nats = F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                   ignore_index=IGNORE_INDEX, reduction="none")
            parts.append(nats[target.flatten() != IGNORE_INDEX].double().cpu())
    chosen = labels != IGNORE_INDEX
    chars = None if characters is None else characters.cpu()[chosen].double().numpy()
    if chars is None:
        chars = np.full(int(chosen.sum()), math.nan)
    return TokenLoss(torch.cat(parts).numpy(), chars, per_state=False), ""
