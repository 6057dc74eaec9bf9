"""`hf-icl bench sgpt` as a script (the benchmark is hf_icl/benchmarks/sgpt.py)."""

from hf_icl.benchmarks.sgpt import main

if __name__ == "__main__":
    main()
