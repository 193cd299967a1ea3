# Shared by tests/ and conformance/: hypothesis profiles chosen explicitly, and the
# conformance suite's options (--impl, --convention, --call-shape).
import os

from hypothesis import HealthCheck, settings

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

# Explicit profiles (hypothesis would otherwise switch itself when it detects CI):
# "ci" is derandomized and bounded; "deep" hunts long with an example database.
settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=10_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("GDPO_HYPOTHESIS_PROFILE", "ci"))
