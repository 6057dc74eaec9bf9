"""`hf-icl reproduce kernel-icl EXPERIMENT` as a script: `python scripts/reproduce_kernel_icl.py all`.

The study (ICL as kernel regression: angular row kernels and GA column attention, seed 000) lives in
hf_icl/reproduce/kernel_icl/; `--help` lists its experiments (table1, table2, figures, all) and flags.
"""

import sys

from hf_icl.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", "kernel-icl", *sys.argv[1:]]))
