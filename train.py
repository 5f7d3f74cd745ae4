"""Train a character-level decoder or encoder on enwik8.

    python train.py model=gpt_small masking=causal
"""

import hydra
from omegaconf import DictConfig

from repgeom.train import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
