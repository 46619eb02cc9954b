"""Profile a Hugging Face Trainer run with one line: `callbacks=[StepscopeCallback(...)]`.

    python examples/hf_trainer.py OUTPUT_DIR [--max-steps 12] [--grad-accum 2]

A tiny GPT-2 built from a config (nothing is downloaded) trains on random tokens on the CPU. The run folder
goes to OUTPUT_DIR/stepscope/<run>; the headline numbers reach TensorBoard through the Trainer's own log.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from stepscope.integrations.hf import StepscopeCallback


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, size: int, length: int = 32, vocab: int = 128) -> None:
        self.size, self.length, self.vocab = size, length, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        ids = torch.randint(0, self.vocab, (self.length,), generator=generator)
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--grad-accum", type=int, default=2)
    args = parser.parse_args()
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128, n_positions=32)
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=args.grad_accum,
        logging_steps=5,
        report_to=["tensorboard"],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    stepscope = StepscopeCallback(wait=2, warmup=1, active=3, console=False)
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=RandomTokens(args.max_steps * args.grad_accum * 4),
        callbacks=[stepscope],
    )
    trainer.train()
    print(f"stepscope run folder: {stepscope.run_dir}")


if __name__ == "__main__":
    main()
