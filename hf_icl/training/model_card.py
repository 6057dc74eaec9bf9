"""The README.md model card written next to a trained model's weights."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData


def write_model_card(
    output_dir: str | Path,
    training_config: dict,
    metrics: dict[str, float] | None = None,
    plot_file: str | None = None,
    results_table: str | None = None,
) -> Path:
    """Write ``output_dir/README.md``: training config, final metrics, context-scaling plot and table.

    ``plot_file`` is a path relative to ``output_dir`` (the card links it as an image).
    """
    import yaml

    output_dir = Path(output_dir)
    task = training_config.get("task", "an ICL task")
    model_type = training_config.get("model_type", "icl model")
    data = ModelCardData(library_name="hf_icl", tags=["in-context-learning", "hf_icl", model_type, task])
    sections = [
        f"# {model_type} trained in context on `{task}`",
        "Trained with hf_icl's Accelerate trainer (`hf-icl train`). Load it with:",
        "```python\nimport hf_icl  # registers the architecture with the Auto classes\n"
        "from transformers import AutoModel\n"
        f'model = AutoModel.from_pretrained("{output_dir.name}")\n'
        "predictions = model(xs, ys).predictions  # xs (B, N, d), ys (B, N): every position at once\n```",
    ]
    if metrics:
        rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in metrics.items() if isinstance(v, (int, float)))
        sections.append(f"## Final metrics\n\n| metric | value |\n|---|---:|\n{rows}")
    if plot_file:
        sections.append(f"## Context scaling\n\n![error vs number of in-context examples]({plot_file})")
    if results_table:
        sections.append(results_table)
    config_yaml = yaml.safe_dump(training_config, sort_keys=False)
    sections.append(f"## Training configuration\n\n```yaml\n{config_yaml}```")
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")
    path = output_dir / "README.md"
    card.save(path)
    return path
