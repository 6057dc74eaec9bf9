"""`hf-icl bench samplers` as a script (the benchmark is hf_icl/benchmarks/samplers.py)."""

from hf_icl.benchmarks.samplers import main

if __name__ == "__main__":
    main()
