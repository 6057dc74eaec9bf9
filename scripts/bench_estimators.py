"""`hf-icl bench estimators` as a script (the benchmark is hf_icl/benchmarks/estimators.py)."""

from hf_icl.benchmarks.estimators import main

if __name__ == "__main__":
    main()
