"""`hf-icl reproduce linear-attention EXPERIMENT` as a script: `python scripts/reproduce_linear_vs_softmax.py all`.

The study (linear vs softmax attention on in-context linear regression, seed 002) lives in
hf_icl/reproduce/linear_attention/ (experiments.py); `--help` lists its experiments (table1, table2, table3, all,
ablation, engines) and flags.
"""

import sys

from hf_icl.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", "linear-attention", *sys.argv[1:]]))
