"""The SGPT figures' plots: the ridge sweep (Fig. 2/3, right panels) names every line it draws in its legend."""

from toy_scales import SGPT_TOY

from hf_icl.estimators import get_estimator
from hf_icl.reproduce import plots
from hf_icl.reproduce.report import Report
from hf_icl.reproduce.sgpt import ExperimentState
from hf_icl.reproduce.sgpt.figures import _ridge_sweep


def test_the_ridge_sweep_names_the_ridge_curve_and_every_trained_model_in_its_legend(
    tmp_path, monkeypatch, kept_figures
):
    figures = kept_figures(plots)
    ctx = ExperimentState(SGPT_TOY, tmp_path, Report("sgpt", "fig2", "t", "toy", "c", tmp_path))
    # estimators stand in for the trained models: two at the same error, as SGPT and GPT-2 can be
    trained = {"SGPT": get_estimator("least_squares"), "GPT-2": get_estimator("least_squares")}
    _ridge_sweep(ctx, trained, {"weight_prior": "scaled", "noise_std": 0.5}, d=3, position=3)
    (fig,) = figures.values()
    (ax,) = fig.axes
    fig.canvas.draw()
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["ridge", "SGPT", "GPT-2"]
    assert all(line.get_label() in legend for line in lines)
    sgpt, gpt2 = lines[1:]
    assert list(sgpt.get_ydata()) == list(gpt2.get_ydata())  # the same error, drawn where it is
    assert (sgpt.get_color(), sgpt.get_linestyle()) != (gpt2.get_color(), gpt2.get_linestyle())
    box = ax.title.get_window_extent(fig.canvas.get_renderer())
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1
