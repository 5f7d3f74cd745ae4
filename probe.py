"""Probe checkpoints, runs and Hugging Face models: `python probe.py hf=gpt2` (conf/probe.yaml)."""

import hydra
from omegaconf import DictConfig

from repgeom.analyses.probe_extras import probe


@hydra.main(version_base="1.3", config_path="conf", config_name="probe")
def main(cfg: DictConfig) -> None:
    probe(cfg)


if __name__ == "__main__":
    main()
