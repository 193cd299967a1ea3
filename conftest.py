# Shared by tests/ and conformance/: hypothesis profiles chosen explicitly.
import os

from hypothesis import HealthCheck, settings

# Explicit profiles (hypothesis would otherwise switch itself when it detects CI):
# "ci" is derandomized and bounded; "deep" hunts long with an example database.
settings.register_profile("ci", derandomize=True, max_examples=40, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=10_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("GDPO_HYPOTHESIS_PROFILE", "ci"))
