"""Rebuild docs/results/common_bias/README.md from the summary.json files of its run folders.

    python scripts/render_common_bias.py [RESULTS_DIR]

RESULTS_DIR (default docs/results/common_bias) holds one folder per model, each written by
`repgeom-common-bias ... hydra.run.dir=RESULTS_DIR/<model>`.
"""

import json
import sys
from pathlib import Path

from repgeom.experiments.common_bias import render_markdown

ROOT = Path(__file__).resolve().parents[1]
ORDER = {"gpt_tiny": 0, "gpt_small": 1, "bert_small": 2}  # smallest first, then the encoder


def main(argv: list[str]) -> Path:
    results = Path(argv[0]) if argv else ROOT / "docs" / "results" / "common_bias"
    paths = sorted(results.glob("*/summary.json"))
    if not paths:
        raise SystemExit(f"no */summary.json under {results}; run the experiment first")
    summaries = [json.loads(p.read_text()) for p in paths]
    summaries.sort(key=lambda s: (ORDER.get(s["model"], len(ORDER)), s["model"]))
    readme = results / "README.md"
    readme.write_text(render_markdown(summaries))
    print(f"wrote {readme} from {len(paths)} summaries")
    return readme


if __name__ == "__main__":
    main(sys.argv[1:])
