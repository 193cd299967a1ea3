"""What impl.integrations costs (issue 26): at import, and per TRL training step.

    python -m benchmarks.integrations_cost            # needs TRL 1.16 (pip install -e '.[trl]')

Import: fresh interpreters, in turns, medians of ``--repeats``: ``import impl.gdpo`` alone and
with ``impl.integrations.trl`` (which imports no TRL), then TRL's ``GRPOTrainer`` alone and
through ``impl.integrations.trl.GDPOTrainer``. Per step: TRL's ``GRPOTrainer`` and
``GDPOTrainer`` train the same tiny model (one-layer Llama of width 16, built here) on the same
data, in turns, one optimizer step each; and the added work alone, impl.gdpo on a gathered
batch of TRL's shape, at the tiny batch and at a real-sized one (N = 1,024 completions,
groups of 16, K = 3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> float:
    """Seconds a fresh interpreter spends on ``code`` (timed inside it, interpreter start excluded)."""
    wrapped = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", wrapped], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def import_costs(repeats: int) -> dict:
    cases = {
        "impl.gdpo": "import impl.gdpo",
        "impl.gdpo + impl.integrations.trl (no TRL)": "import impl.gdpo, impl.integrations.trl",
        "impl.gdpo + impl.integrations.swift (no ms-swift)": "import impl.gdpo, impl.integrations.swift",
        "trl.GRPOTrainer (impl.gdpo imported first)": "import impl.gdpo\nfrom trl import GRPOTrainer",
        "impl.integrations.trl.GDPOTrainer": "from impl.integrations.trl import GDPOTrainer",
    }
    runs = {name: [] for name in cases}
    for _ in range(repeats):
        for name, code in cases.items():
            runs[name].append(_fresh(code))
    return {name: statistics.median(v) for name, v in runs.items()}


def _tiny():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(13)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)

    def model():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)

    return model, tokenizer


def _reward_a(completions, **kw):
    return [float(i % 3) + 0.125 * len(c.split()) for i, c in enumerate(completions)]


def _reward_b(completions, **kw):
    return [float((5 * i) % 7) / 4 for i, _ in enumerate(completions)]


def step_costs(repeats: int) -> dict:
    import datasets
    import trl

    from impl.integrations.trl import GDPOTrainer

    model, tokenizer = _tiny()
    data = datasets.Dataset.from_dict({"prompt": [f"w{3 + i} w{4 + i}" for i in range(4)]})
    runs = {"trl.GRPOTrainer": [], "GDPOTrainer": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats + 1):  # the first round warms up
            for name, cls in (("trl.GRPOTrainer", trl.GRPOTrainer), ("GDPOTrainer", GDPOTrainer)):
                args = trl.GRPOConfig(output_dir=tmp, per_device_train_batch_size=16, num_generations=4,
                                      max_completion_length=8, max_steps=2, report_to="none", use_cpu=True,
                                      logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
                                      multi_objective_aggregation="normalize_then_sum")
                trainer = cls(model=model(), reward_funcs=[_reward_a, _reward_b], args=args, train_dataset=data,
                              processing_class=tokenizer)
                t = time.perf_counter()
                trainer.train()
                if r:
                    runs[name].append((time.perf_counter() - t) / 2)
    return {name: statistics.median(v) for name, v in runs.items()}


def call_costs(repeats: int) -> dict:
    from impl import gdpo

    out = {}
    for n, g, k in ((16, 4, 2), (1024, 16, 3)):
        rewards = torch.randint(0, 5, (n, k)).float() / 4
        times = []
        for _ in range(repeats * 20):
            t = time.perf_counter()
            gdpo.gdpo_advantages(rewards, group_size=g, weights=[1.0] * k)
            times.append(time.perf_counter() - t)
        out[f"impl.gdpo on N={n}, groups of {g}, K={k}"] = statistics.median(times)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="write the figures as JSON here")
    a = parser.parse_args(argv)
    figures = {"import_s": import_costs(a.repeats), "step_s": step_costs(a.repeats), "call_s": call_costs(a.repeats),
               "torch": torch.__version__, "threads": torch.get_num_threads()}
    text = json.dumps(figures, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
