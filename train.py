"""Train a character-level decoder or encoder on enwik8 (conf/train.yaml): the same as
`repgeom-train` (`repgeom.cli.train`).

    python train.py model=gpt_small masking=causal
"""

from repgeom.cli.train import main

if __name__ == "__main__":
    main()
