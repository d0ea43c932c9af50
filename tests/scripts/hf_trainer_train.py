"""A transformers.Trainer script as people write them: a tiny GPT-2 (random init, no download), a
dataset of token ids, TrainingArguments from the command line, checkpoints every --save_steps in
--output_dir, and ``trainer.train(resume_from_checkpoint=...)`` to continue from one."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", required=True)
parser.add_argument("--max_steps", type=int, default=12)
parser.add_argument("--save_steps", type=int, default=6)
parser.add_argument("--resume_from_checkpoint", default=None)
parser.add_argument("--seed_late", action="store_true")  # the model made before any seed: Trainer seeds after
args = parser.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=24, length=16, vocab=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


if not args.seed_late:
    set_seed(0)  # before the model is made, as the library's examples do
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
training_args = TrainingArguments(
    output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, save_strategy="steps",
    per_device_train_batch_size=4, learning_rate=1e-3, warmup_steps=2, logging_steps=100, report_to=[],
    seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
)
trainer = Trainer(model=GPT2LMHeadModel(config), args=training_args, train_dataset=Tokens())
trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()},
           f"{args.output_dir}/final.pt")
