"""Whisper's decoder (verify, transformers 4.57.6) vs the generated adapter: see
bench/transformers_whisper.py for the commands and what is measured."""

from bench.harness import main
from bench.transformers_whisper import workload

WORKLOAD = workload("verify")

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
