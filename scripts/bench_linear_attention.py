"""`hf-icl bench linear-attention` as a script (the benchmark is hf_icl/benchmarks/linear_attention.py)."""

from hf_icl.benchmarks.linear_attention import main

if __name__ == "__main__":
    main()
