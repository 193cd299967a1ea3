# Shared by tests/ and conformance/: the conformance suite's pytest plugin (its options
# --impl, --convention, --call-shape, its markers and its hypothesis profiles).
import os

# The options live in conformance/plugins.py (pytest_addoption). Registered here, at
# the root, pytest loads them on every run, so `pytest --impl mod:fn` works with no
# path; `gdpo check` passes `-p conformance.plugins` too, and pytest registers a
# plugin once by name, so the options are never added twice.
pytest_plugins = ("conformance.plugins",)

# Without a GPU the fused kernels' tests (tests/test_impl_fused.py) run them in Triton's
# interpreter, which Triton chooses when it is first imported: set here, before any test
# module can import it (torch._dynamo, imported by some torch features, imports Triton).
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
