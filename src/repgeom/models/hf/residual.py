"""The residual stream of a Hugging Face model: its block stack, its final norm, and hooks.

Hugging Face's ``output_hidden_states`` gives the embedding output and the input of every block;
for pre-LN models its last entry is the final norm's output. `ResidualRecorder` reads the last
block's output and the final norm's output with forward hooks instead (the rule that finds the
final norm is in `final_norm_module` and in `repgeom.models.hf`'s docstring).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


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
            f"{stacks or 'none'}; repgeom.models.hf cannot tell where its residual stream is"
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
            "repgeom.models.hf cannot tell which one is the final norm"
        )
    return next(iter(found.values()))[1] if found else None


class ResidualRecorder:
    """Hooks that read the last block's output and the final norm's output (checking that the
    final norm reads the last block's output)."""

    def __init__(self, model: nn.Module) -> None:
        self.last_block = block_stack(model)[-1]
        self.norm = final_norm_module(model)
        self.block_out: torch.Tensor | None = None
        self.norm_in: torch.Tensor | None = None
        self.norm_out: torch.Tensor | None = None
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> ResidualRecorder:
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
                "output in this model; repgeom.models.hf does not know its layout"
            )
        return self.block_out, self.norm_out
