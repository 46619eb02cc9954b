"""A plain DeepSpeed training loop on CPU ranks (gloo) with the monitor line as its only addition:
`torchrun --standalone --nproc_per_node 2 tests/support/jobs/deepspeed_loop.py OUT_DIR STAGE [MICRO_STEP_CALLS]`; or the HF
Trainer under DeepSpeed (ZeRO-2) with stepscope's callback: `... tests/support/jobs/deepspeed_loop.py OUT_DIR hf`.

STAGE: the ZeRO stage (0-3). The engine trains a 3-layer MLP with `torch_adam` for STEPS optimizer steps of
GA_STEPS micro-batches each (`engine(x)`, `engine.backward(loss)`, `engine.step()` per micro-batch).
MICRO_STEP_CALLS (`calls`): the loop also calls `monitor.step()` after every micro-batch, as a loop written for
the monitor before would; the engine's optimizer steps count all the same.
The monitor: wait 1, warmup 0, active 2, repeat 1 (optimizer steps 1-2 traced), flop_counter_step 4 and the
memory log every 2 steps.
HF: a 1-layer GPT-2 (n_embd 32, vocab 64, 16 tokens) built from a config, HF_STEPS optimizer steps of GA_STEPS
micro-batches of MICRO_BATCH, the callback with wait 1, active 2 (Trainer steps 2-3) and flop_counter_step 4.
"""

from __future__ import annotations

import os
import sys

import deepspeed
import torch
from torch import nn

import stepscope

HF_STEPS = 8
STEPS = 11  # 5 undisturbed steps after the counted one: a TFLOP/s median
GA_STEPS = 2
MICRO_BATCH = 4
WIDTH = 64


def hf_trainer(out_dir: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from stepscope.integrations.hf import StepscopeCallback

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    data = [
        {"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)
    ]
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "Adam", "params": {"lr": "auto", "torch_adam": True}},
    }
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=GA_STEPS,
        max_steps=HF_STEPS,
        deepspeed=ds_config,
        use_cpu=True,
        report_to=[],
        logging_steps=100,
        save_strategy="no",
        disable_tqdm=True,
    )
    callback = StepscopeCallback(
        out_dir=out_dir, wait=1, warmup=0, active=2, profiled_ranks="all", flop_counter_step=4, console=False
    )
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()


def main() -> None:
    if sys.argv[2] == "hf":
        hf_trainer(sys.argv[1])
        return
    out_dir, stage = sys.argv[1], int(sys.argv[2])
    micro_step_calls = len(sys.argv) > 3 and sys.argv[3] == "calls"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)
    )
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GA_STEPS,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    monitor = stepscope.performance_monitor(
        engine,
        out_dir=out_dir,
        profiled_ranks="all",
        wait=1,
        warmup=0,
        active=2,
        repeat=1,
        flop_counter_step=4,
        memory_log_every=2,
        console=False,
    )
    rank = int(os.environ.get("RANK", "0"))
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS * GA_STEPS):
        x = torch.randn(MICRO_BATCH, WIDTH, generator=generator)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if micro_step_calls:
            monitor.step()
    print(f"rank {rank} global_steps {engine.global_steps} run_dir {monitor.run_dir}", flush=True)


if __name__ == "__main__":
    main()
