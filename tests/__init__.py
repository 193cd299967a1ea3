"""This checkout's own tests, a regular package: some packages install a top-level ``tests``
package of their own into site-packages (verl 0.9.1 and TransferQueue do, and .ci/run installs
them), and a regular package anywhere on the path wins over a folder without ``__init__.py``,
so ``from tests import _dist`` would import theirs."""
