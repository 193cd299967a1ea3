# Shared by tests/ and conformance/: the conformance suite's pytest plugin (its options
# --impl, --convention, --call-shape, its markers and its hypothesis profiles).
import os

# The options live in conformance/plugins.py (pytest_addoption). Registered here, at
# the root, pytest loads them on every run, so `pytest --impl mod:fn` works with no
# path; `gdpo check` passes `-p conformance.plugins` too, and pytest registers a
# plugin once by name, so the options are never added twice.
pytest_plugins = ("conformance.plugins",)

# The test helpers under tests/ (tests/_native_impls.py and the like) are graded as top-level
# modules (`--impl _native_impls:trl_float32`), so tests/ is on sys.path for every test module,
# whichever ran first in its process: a test file that forgot its own sys.path line passed
# when an xdist worker had run another file first and failed alone.
import sys  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))

# Compiled once: a shell with PYTHONDONTWRITEBYTECODE=1 would make every Python this suite
# starts (the xdist workers, each `pytest` and `gdpo` subprocess, every gloo rank) compile the
# project again and rewrite every test module's asserts again (about 2 s per pytest process).
# The bytecode goes to a folder of its own in the temporary directory instead (PEP 3147's
# prefix, which pytest's assertion rewriting honours too): nothing is written into the tree,
# which is what that setting asks for. Set here, before the xdist workers start.
if os.environ.get("PYTHONDONTWRITEBYTECODE"):
    import sys
    import tempfile

    _prefix = os.path.join(tempfile.gettempdir(), f"gdpo-spec-pycache-{os.getuid()}")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = _prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, _prefix
