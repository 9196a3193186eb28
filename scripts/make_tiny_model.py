#!/usr/bin/env python3
"""Build a tiny, random Qwen2 causal LM that ms-swift can train on a CPU, without any download.

Why: the end-to-end tests launch real ``swift sft`` / ``swift rlhf`` runs, but no hub is reachable from
the development machines or CI. So the model is made here, from nothing:

* a byte-level BPE tokenizer trained locally with ``tokenizers`` on a small built-in text, with Qwen's
  special tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and a ChatML chat template, so that
  ms-swift's ``qwen`` template encodes the conversation markers as single tokens;
* a ``Qwen2ForCausalLM`` with hidden size 64 and 2 layers, random weights from a fixed seed.

Both are written with ``save_pretrained`` so ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` and
ms-swift (``--model OUT_DIR --model_type qwen2 --template qwen``) load them from the folder. The output is
deterministic: the same seed, the same corpus, the same files.

Usage (with the ms-swift venv's python; needs torch, transformers, tokenizers)::

    python scripts/make_tiny_model.py OUT_DIR [--force]

Idempotent: does nothing if ``OUT_DIR/config.json`` exists, unless ``--force``.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2's ChatML template, trimmed of tool calling: a default system prompt, then
# <|im_start|>role\ncontent<|im_end|>\n for each message, and the generation prompt.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# A small built-in corpus: enough for a few hundred merges covering the test data's words.
CORPUS = """\
You are a helpful assistant.
The reconciler reads the desired state from git and makes the cluster match it.
A training run has a model, a dataset, a number of steps and a place to save checkpoints.
What is the capital of France? The capital of France is Paris.
What is two plus two? Two plus two is four.
Name a colour of the sky. The sky is blue on a clear day.
How many days are in a week? There are seven days in a week.
Which animal says meow? A cat says meow.
Which animal barks? A dog barks.
What do bees make? Bees make honey.
Translate hello into French. Hello in French is bonjour.
What is the opposite of hot? The opposite of hot is cold.
What is water made of? Water is made of hydrogen and oxygen.
Count from one to five. One, two, three, four, five.
What colour is grass? Grass is green.
Where does the sun rise? The sun rises in the east.
What is the largest planet? Jupiter is the largest planet.
Say something polite. Thank you very much, have a nice day.
Is this answer good or bad? This answer is good. That answer is bad.
Sorry, I do not know. I am not sure about that.
0 1 2 3 4 5 6 7 8 9 10 100 1000
abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'"()[]{}<>-_=+*/\\|@#$%^&~`
"""


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so that pair counts are stable; training is deterministic for a fixed input.
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build_model(tokenizer, seed: int):
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # Round the vocabulary up to a multiple of 64, as real checkpoints do.
    vocab = ((len(tokenizer) + 63) // 64) * 64
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        max_window_layers=2,
        use_sliding_window=False,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    config.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
        do_sample=False,
        max_new_tokens=32,
    )
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR/config.json exists")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--vocab-size", type=int, default=600, help="BPE vocabulary size (before rounding)")
    args = parser.parse_args(argv)

    out = os.path.abspath(args.out_dir)
    if os.path.exists(os.path.join(out, "config.json")) and not args.force:
        print(f"tiny model already at {out} (use --force to rebuild)")
        return 0

    t0 = time.monotonic()
    random.seed(args.seed)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = build_tokenizer(args.vocab_size)
    model = build_model(tokenizer, args.seed)

    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    n_params = sum(p.numel() for p in model.parameters())
    sample = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    ids = tokenizer(sample)["input_ids"]
    print(f"tiny Qwen2 written to {out}: {n_params} parameters, vocab {model.config.vocab_size} "
          f"(tokenizer {len(tokenizer)}), chat sample {len(ids)} tokens, {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
