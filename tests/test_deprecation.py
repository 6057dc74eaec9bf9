"""hf_icl.deprecation: moved names warn and give the object itself, retired names say what replaces them, unknown
names stay plain AttributeErrors, renamed argument values warn and map; and the places that use it."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from hf_icl import deprecation
from hf_icl.deprecation import moved, renamed_value, retired


def _module(name: str, **getattrs) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in getattrs.items():
        setattr(module, key, value)
    return module


def test_moved_warns_names_the_new_path_and_returns_the_same_object():
    getattr_ = moved("hf_icl.old_home", {"moved": "hf_icl.deprecation"})
    with pytest.warns(
        DeprecationWarning,
        match=r"^hf_icl\.old_home\.moved moved to hf_icl\.deprecation\.moved; the old path goes in the next release$",
    ):
        assert getattr_("moved") is deprecation.moved


def test_moved_follows_a_rename():
    getattr_ = moved("hf_icl.old_home", {"old_name": "hf_icl.deprecation"}, renamed={"old_name": "retired"})
    with pytest.warns(DeprecationWarning, match=r"old_home\.old_name moved to hf_icl\.deprecation\.retired"):
        assert getattr_("old_name") is retired


def test_an_unknown_name_is_a_plain_attribute_error_without_a_warning():
    for getattr_ in (moved("hf_icl.x", {"a": "hf_icl.deprecation"}), retired("hf_icl.x", {"b": "c"})):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(AttributeError, match=r"^module 'hf_icl\.x' has no attribute 'nothing'$"):
                getattr_("nothing")


def test_a_module_getattr_serves_getattr_and_hasattr():
    module = _module("hf_icl.fake", __getattr__=moved("hf_icl.fake", {"moved": "hf_icl.deprecation"}))
    with pytest.warns(DeprecationWarning):
        assert module.moved is moved
    assert not hasattr(module, "nothing")
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_retired_says_why_and_what_replaces_it():
    getattr_ = retired("hf_icl.x", {"old": "hf_icl.y.new"}, reason="with the old rule")
    with pytest.raises(AttributeError, match=r"^hf_icl\.x\.old was retired with the old rule; use hf_icl\.y\.new$"):
        getattr_("old")
    with pytest.raises(AttributeError, match=r"^hf_icl\.x\.old was retired; use hf_icl\.y\.new$"):
        retired("hf_icl.x", {"old": "hf_icl.y.new"})("old")


def test_moved_falls_back_to_another_getattr():
    getattr_ = moved("hf_icl.x", {"moved": "hf_icl.deprecation"}, fallback=retired("hf_icl.x", {"gone": "z"}))
    with pytest.raises(AttributeError, match="hf_icl.x.gone was retired; use z"):
        getattr_("gone")
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        getattr_("other")


def test_renamed_value_warns_and_maps_only_old_values():
    with pytest.warns(DeprecationWarning, match=r"backend='reference' is deprecated, use backend='torch'"):
        assert renamed_value("backend", "reference", {"reference": "torch"}) == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert renamed_value("backend", "triton", {"reference": "torch"}) == "triton"
        unhashable = ["reference"]
        assert renamed_value("backend", unhashable, {"reference": "torch"}) is unhashable


def test_deprecation_imports_nothing_from_hf_icl():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(deprecation.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [name for name in imported if name.startswith("hf_icl") or not name or "." == name[0]]


# -- the places that use it --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "old_module, new_module, name",
    [
        ("hf_icl.kernels.row_kernels", "hf_icl.similarity.row_kernels", "row_kernel_scores"),
        ("hf_icl.kernels.column_attention", "hf_icl.similarity.column_attention", "column_mixing_weights"),
        ("hf_icl.attention.kernels", "hf_icl.similarity", "cayley_scores"),
        ("hf_icl.cli", "hf_icl.cli.icl_commands", "run_evaluate"),
        ("hf_icl.cli", "hf_icl_cli.commands", "COMMANDS"),
        ("hf_icl.data", "hf_icl.evaluation.repetition", "distinct_n"),
        ("hf_icl.data.stories", "hf_icl.evaluation.repetition", "story_tokens"),
        ("hf_icl.attention.selection", "hf_icl.attention.preservation", "attention_preservation"),
    ],
)
def test_moved_public_names_keep_their_old_paths(old_module, new_module, name):
    import importlib

    old, new = importlib.import_module(old_module), importlib.import_module(new_module)
    with pytest.warns(DeprecationWarning, match=rf"^{old_module}\.{name} moved to {new_module}\.{name}; "):
        assert getattr(old, name) is getattr(new, name)
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018


def test_the_old_backend_name_reference_still_runs_the_pytorch_path():
    from hf_icl.attention import CABParams
    from hf_icl.kernels import coarsen_max_l2

    q, k = torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
    with pytest.warns(DeprecationWarning, match=r"backend='reference' is deprecated, use backend='torch'"):
        old = coarsen_max_l2(q, k, 16, backend="reference")
    for a, b in zip(old, coarsen_max_l2(q, k, 16, backend="torch"), strict=True):
        assert torch.equal(a, b)
    with pytest.warns(DeprecationWarning, match=r"cab_backend='reference' is deprecated, use cab_backend='torch'"):
        assert CABParams(backend="reference").backend == "torch"
