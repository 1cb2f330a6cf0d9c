"""A script of examples/ loaded as a module, for the tests that run the examples at tiny
size."""
import importlib.util
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def load_example(name: str):
    """examples/<name>.py as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
