"""`hf-icl bench cab` as a script (the benchmark is hf_icl/benchmarks/cab.py)."""

from hf_icl.benchmarks.cab import main

if __name__ == "__main__":
    main()
