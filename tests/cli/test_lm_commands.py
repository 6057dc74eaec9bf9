"""hf_icl.cli.lm_commands: defaults that fit the model given, one default block size."""

import doctest

import pytest
from repo_paths import REPO

import hf_icl.cli.lm_commands
from hf_icl.attention.cab_params import CABParams
from hf_icl.cli import main
from hf_icl.cli.lm_commands import default_niah_lengths
from hf_icl.cli.parser import build_parser


class Captured(Exception):
    pass


def test_niah_default_lengths_fit_the_shipped_retriever(monkeypatch, tmp_path):
    """models/niah-retriever has 1040 positions: the defaults are 256, 512, 1024 (they were 1024-4096: refused)."""

    def capture(model, tokenizer, **grid):
        raise Captured(grid["context_lengths"], grid["block_size"])

    monkeypatch.setattr("hf_icl.evaluation.niah.run_niah", capture)
    argv = ["niah", "--model", str(REPO / "models" / "niah-retriever"), "--output-dir", str(tmp_path), "--no-progress"]
    with pytest.raises(Captured) as captured:
        main(argv)
    assert captured.value.args == ([256, 512, 1024], CABParams().block_size)


def test_the_lengths_rule_and_one_default_block_size():
    assert default_niah_lengths(8192) == [1024, 2048, 4096]  # capped at 4096
    assert default_niah_lengths(2048) == [256, 512, 1024]  # 2048 leaves no room for the answer
    assert default_niah_lengths(2064) == [512, 1024, 2048]
    parser = build_parser()
    for command in (["niah", "--model", "m"], ["perplexity", "--model", "m", "--length", "8"]):
        assert parser.parse_args(command).block_size == CABParams().block_size == 64
    assert doctest.testmod(hf_icl.cli.lm_commands).failed == 0
