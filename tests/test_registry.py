"""hf_icl.registry: the one class-registry decorator (task families and input distributions use it)."""

import doctest

import hf_icl.registry
from hf_icl.data.inputs import INPUT_REGISTRY, register_inputs
from hf_icl.data.task_family import TASK_REGISTRY, register_task
from hf_icl.registry import named_registration


def test_registration_names_the_class_and_fills_only_its_own_registry():
    first, second = {}, {}
    register_first, register_second = named_registration(first), named_registration(second)

    @register_first("a")
    class A:
        pass

    assert A.name == "a" and first == {"a": A} and second == {}
    register_second("b")(A)
    assert A.name == "b" and second == {"b": A} and first == {"a": A}


def test_the_data_registries_are_filled_by_it():
    assert TASK_REGISTRY["linear_regression"].name == "linear_regression"
    assert all(cls.name == name for name, cls in INPUT_REGISTRY.items())
    assert register_task.__qualname__ == register_inputs.__qualname__ == "named_registration.<locals>.register"


def test_docstring_examples_run():
    assert doctest.testmod(hf_icl.registry).failed == 0
