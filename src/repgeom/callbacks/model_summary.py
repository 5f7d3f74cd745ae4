"""Lightning's rich model summary without its FLOPs column and its ``Total FLOPs`` line.

Lightning counts FLOPs only when the module sets ``example_input_array``
(`lightning.pytorch.utilities.model_summary.ModelSummary`); ours does not (a window's FLOPs are
estimated in `repgeom.models.lightning_module` for the MFU), so the column reads 0 for every
layer and the total reads 0: a number that is wrong, not small. Everything else is Lightning's
`RichModelSummary`: the layer table and the parameter counts.

Setting ``example_input_array`` instead would not give the FLOPs the run reports: Lightning runs
that example through the module's forward at fit start (CharLM has none: its steps call the
GPT) and counts one forward's FLOPs (`torch.utils.flop_counter`), where the MFU's
`flops_per_window` is a training step's, forward and backward, estimated as nanoGPT does. For a
2-layer, 64-wide GPT on 64-token windows: 14.2 MFLOP against 49.6 MFLOP per window (3.5 times;
the estimate's forward part alone, 2N + 4 L d T per token, is 16.5 MFLOP).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)

FLOPS_COLUMN = "FLOPs"


class ModelSummaryWithoutFlops(RichModelSummary):
    """`RichModelSummary` minus the FLOPs column and line (conf/callbacks/default.yaml)."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != FLOPS_COLUMN]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            if name == " ":
                table.add_column(name, style="dim")
            else:
                table.add_column(name, justify="left" if name in ("Name", "Type") else "right")
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)

        grid = Table.grid(expand=True)
        grid.add_column()
        trainable = get_human_readable_count(int(trainable_parameters))
        frozen = get_human_readable_count(int(total_parameters - trainable_parameters))
        grid.add_row(f"[bold]Trainable params[/]: {trainable}")
        grid.add_row(f"[bold]Non-trainable params[/]: {frozen}")
        grid.add_row(f"[bold]Total params[/]: {get_human_readable_count(int(total_parameters))}")
        grid.add_row(
            f"[bold]Total estimated model params size (MB)[/]: "
            f"{get_formatted_model_size(model_size)}"
        )
        grid.add_row(f"[bold]Modules in train mode[/]: {total_training_modes['train']}")
        grid.add_row(f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}")
        console.print(grid)
