"""Train qeval's shipped tiny model (models/qeval-tiny/) from nothing, deterministically.

    .venv/bin/python scripts/train_tiny_model.py [--steps N] [--out models/qeval-tiny]

A Llama-architecture model with grouped-query attention and a character-level
tokenizer of its own, trained on the text from `tiny_corpus.py` on the CPU (2 cores,
about 20 minutes). The weights are saved in bfloat16 as safetensors.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_corpus as tc

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB_SIZE = 128


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer: printable ASCII plus four special tokens, 128 ids."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    for i in range(len(vocab), VOCAB_SIZE):  # pad to a multiple of 128 (reserved ids)
        vocab[f"<reserved_{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )


def build_model(args: argparse.Namespace) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(tc.SEED)
    return LlamaForCausalLM(cfg)


def batches(
    tokenizer: PreTrainedTokenizerFast, splits: tc.Splits, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Padded (input_ids, labels) batches from the endless document stream."""
    docs = tc.training_documents(splits)
    while True:
        texts = [next(docs) + tokenizer.eos_token for _ in range(batch_size)]
        enc = tokenizer(texts, padding=True, return_tensors="pt")
        labels = enc.input_ids.clone()
        labels[enc.attention_mask == 0] = -100
        yield enc.input_ids, enc.attention_mask, labels


@torch.no_grad()
def greedy_accuracy(model, tokenizer, prompts: list[str], targets: list[str]) -> float:
    """Quick in-training check: greedy completion of each prompt, exact match."""
    model.eval()
    tokenizer.padding_side = "left"
    correct = 0
    for i in range(0, len(prompts), 100):
        enc = tokenizer(prompts[i : i + 100], padding=True, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=0)
        for row, tgt in zip(out[:, enc.input_ids.shape[1] :], targets[i : i + 100], strict=True):
            text = tokenizer.decode(row, skip_special_tokens=True).split("\n")[0].strip()
            correct += text == tgt
    tokenizer.padding_side = "right"
    model.train()
    return correct / len(prompts)


def evaluate(model, tokenizer, splits: tc.Splits) -> dict[str, float]:
    add_p = [tc.addition_text(a, b) for a, b in splits.add_eval]
    add_t = [str(a + b) for a, b in splits.add_eval]
    return {
        "addition": greedy_accuracy(model, tokenizer, add_p, add_t),
        "facts": greedy_accuracy(
            model, tokenizer, [f.prompt for f in splits.fact_eval], [f.code for f in splits.fact_eval]
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("models/qeval-tiny"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500, help="0: no in-training evaluation")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    tokenizer = build_tokenizer()
    splits = tc.make_splits()
    model = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params:,}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = 200
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)),
    )
    model.train()
    t0 = time.time()
    for step, (ids, mask, labels) in enumerate(batches(tokenizer, splits, args.batch), 1):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f} {time.time() - t0:.0f}s", flush=True)
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            print(f"step {step} eval {evaluate(model, tokenizer, splits)}", flush=True)
        if step >= args.steps:
            break
    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    (args.out / "training_args.json").write_text(
        json.dumps({k: str(v) for k, v in vars(args).items()} | {"params": n_params}, indent=2) + "\n"
    )
    print(f"saved to {args.out} after {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
