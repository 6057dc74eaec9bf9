"""What ``hf-icl`` offers: its description and every command with its one-line help.

The one home of both: the torch-free front door (:mod:`hf_icl_cli`) lists them, and :mod:`hf_icl.cli.parser` builds
each command's parser with them. Imports nothing.
"""

DESCRIPTION = """\
in-context learning research on Hugging Face: train ICL models, compare them with classical
estimators, evaluate under distribution shifts, CAB block-sparse attention on real LLMs.

Every long option takes both spellings (--n-prompts or --n_prompts); `hf-icl COMMAND --help`
lists a command's options. Multi-GPU:
  accelerate launch -m hf_icl.cli train --config configs/garg_linear_regression.yaml
"""

#: every sub-command and its one-line help (hf_icl.cli.parser builds its parsers with these lines)
COMMANDS = {
    "quickstart": "train a tiny GPT-2 in context, compare it with estimators, save, reload, check",
    "train": "train an ICL model (every training argument is a flag; --config YAML)",
    "evaluate": "evaluate a trained model against estimators (--suite garg: Garg et al.'s distribution shifts)",
    "push": "upload a trained model folder (weights, config, card, plots) to the Hugging Face Hub",
    "compare": "compare in-context estimators on a task family",
    "tasks": "list task families and their hyperparameters",
    "dataset": "build an ICLTasks dataset, save it to disk or push it to the Hub",
    "niah": "needle-in-a-haystack: dense vs CAB policies x sparsities on a causal LM (resumable)",
    "perplexity": "long-text perplexity: dense vs CAB policies x sparsities",
    "reproduce": "reproduce a research document's experiments (hf-icl reproduce --help lists them)",
    "bench": "benchmarks: cab, estimators, linear-attention, samplers, seeds, sgpt, startup (bench NAME --help)",
}
