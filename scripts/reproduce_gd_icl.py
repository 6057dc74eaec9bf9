"""`hf-icl reproduce gd-icl EXPERIMENT` as a script: `python scripts/reproduce_gd_icl.py synthetic`.

The study (categorical in-context learning with the functional-GD transformer, seed 004) lives in
hf_icl/reproduce/gd_icl/ (a package); `--help` lists its experiments (synthetic, features) and flags.
"""

import sys

from hf_icl.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", "gd-icl", *sys.argv[1:]]))
