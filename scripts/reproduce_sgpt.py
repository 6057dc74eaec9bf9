"""`hf-icl reproduce sgpt EXPERIMENT` as a script: `python scripts/reproduce_sgpt.py fig1 [--full] ...`.

The experiments live in hf_icl/reproduce/sgpt/; `--help` lists them and their flags.
"""

import sys

from hf_icl.cli import main

if __name__ == "__main__":
    sys.exit(main(["reproduce", "sgpt", *sys.argv[1:]]))
