"""`hf-icl bench startup` as a script (the benchmark is hf_icl/benchmarks/startup.py)."""

from hf_icl.benchmarks.startup import main

if __name__ == "__main__":
    main()
