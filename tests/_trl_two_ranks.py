"""One GDPOTrainer training step on two processes (gloo, CPU), launched by
tests/test_integration_trl.py with ``python -m torch.distributed.run --standalone
--nproc_per_node 2``: each rank writes, as JSON in ``$GDPO_REPORT_DIR/rank<N>.json`` (a file of
its own: two ranks printing to one pipe can interleave their lines), what it gathered and
whether its slice of the batch and the logged advantages are impl.gdpo's."""

import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
import test_integration_trl as t  # noqa: E402

from impl import gdpo  # noqa: E402

funcs = [t._with_none(t._reward_a, {1}), t._with_none(t._reward_b, {1, 2})]
trainer = t._train(t.gdpo_trl.GDPOTrainer, t.tiny._get_wrapped_function()(), tempfile.mkdtemp(), funcs,
                   per_device_train_batch_size=4)
rewards, local, logged = trainer.seen[0]
rank, n = trainer.accelerator.process_index, local.shape[0]
full = gdpo.gdpo_advantages(rewards, group_size=t.G, weights=[0.75, 1.5], missing="unscored")
report = {"rank": rank, "world": trainer.accelerator.num_processes, "gathered": list(rewards.shape),
          "local": n, "slice": torch.equal(local, full[rank * n:(rank + 1) * n]),
          "log": logged == full.tolist(), "unscored": int(rewards.isnan().all(dim=1).sum())}
with open(os.path.join(os.environ["GDPO_REPORT_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(report, f)

# both ranks leave together and tear their process group down before the interpreter exits: a
# rank that exits while the other's gloo threads still talk to it can abort (SIGABRT), seen once
# in a fresh clone's slow tier after the step had finished
trainer.accelerator.wait_for_everyone()
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
