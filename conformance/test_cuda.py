"""The single-process properties with CUDA tensors (skipped without a CUDA device); the distributed
GPU part runs in ``python -m conformance.gpu_check``."""

import pytest
import torch

from conformance import properties as P
from conformance import runner as R
from conformance.subject import Subject

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("prop", [p for p in P.PROPERTIES if p.world == 0], ids=lambda p: p.name)
def test_property_on_cuda(prop, subject):
    R.run_for_pytest(prop, Subject(subject.target, subject.shape, subject.convention, device="cuda"))
