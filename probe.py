"""Probe checkpoints, runs and Hugging Face models (conf/probe.yaml): the same as
`repgeom-probe` (`repgeom.cli.probe`).

    python probe.py hf=gpt2
"""

from repgeom.cli.probe import main

if __name__ == "__main__":
    main()
