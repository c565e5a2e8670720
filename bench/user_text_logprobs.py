"""How likely the model is to write what the user kept, and to end it where they ended it (issue 26).

Over the completion episodes of a learning-loop run kept with `--keep-data` (its feedback store,
split as the trainer splits it), each episode the user kept or rewrote is turned into the tokens the
completion path would show as the user's text (`feedback.train.policy.user_text_group`: the healed
whitespace, the text, then what ended it in the document), and scored, after the Squid references
the episode was served with, by the base model and by an adapter of that run. Printed per episode
and as means, training and held-out episodes apart: the log-probability of the text, and of the
tokens that end it there (a dedent, two blank lines, an end-of-sequence token). A preference about
where suggestions end is learnt when the second rises.

    python bench/user_text_logprobs.py --data /tmp/squidcode-loop-XXXX --adapter v0001 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]


def scored(model, tokenizer, example) -> dict | None:
    """The episode's user text as trained tokens, and their log-probabilities (text, ending) under
    the base model and the adapter; None when the completion path would not show it."""
    import torch

    from feedback.train.policy import (
        SampledGroup,
        _tokens_covering,
        completion_prompt,
        example_prompt_ids,
        group_logprobs,
        reference_prefix,
        user_text_group,
    )

    prompt = example_prompt_ids(tokenizer, example)
    empty = SampledGroup(prompt, torch.zeros((1, 1), dtype=torch.long), torch.ones((1, 1), dtype=torch.long),
                         ["\0"], None)  # one row that shows nothing, replaced by the user's text
    group = user_text_group(tokenizer, example, empty, 1 << 16)
    if group is None:
        return None
    ids = group.completions[0].tolist()
    _, heal = completion_prompt(tokenizer, example)
    wanted = group.texts[0][len(example.prompt_lead):]
    text_tokens = _tokens_covering(tokenizer, ids, len(heal) + len(wanted))
    result = {"id": example.id, "text": wanted, "ending": tokenizer.decode(ids[text_tokens:])}
    for name in ("base", "adapter"):
        with torch.no_grad():
            if name == "base":
                with model.disable_adapter():
                    group.context = reference_prefix(model, tokenizer, example)
                    logps = group_logprobs(model, group, 1.0)[0]
            else:
                group.context = reference_prefix(model, tokenizer, example)
                logps = group_logprobs(model, group, 1.0)[0]
        result[name] = {"text": float(logps[:text_tokens].sum()), "ending": float(logps[text_tokens:].sum())}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a learning-loop run's data folder")
    parser.add_argument("--adapter", required=True, help="the version of that run to compare (v0001)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="where the per-episode figures go")
    args = parser.parse_args()

    import torch

    from context.config import ModelConfig, TrainConfig, default_cache_dir
    from context.runtime import get_runtime
    from feedback.train.policy import attach_lora
    from feedback.train.service import load_training_data
    from feedback.train.store_source import FeedbackStoreSource

    torch.set_num_threads(args.threads)
    runtime = get_runtime(ModelConfig(), default_cache_dir())
    version = args.data / "train" / "adapters" / "versions" / args.adapter
    model = attach_lora(runtime.model, 8, 16, adapter_path=str(version))
    model.eval()
    train, held_out, _ = load_training_data(TrainConfig(), FeedbackStoreSource(args.data / "feedback.db"))
    report = {"data": str(args.data), "adapter": args.adapter}
    for split, examples in (("train", train), ("held_out", held_out)):
        rows = [row for row in (scored(model, runtime.tokenizer, ex) for ex in examples) if row is not None]
        for row in rows:
            print(f"{split:8} {row['text'][:48]!r:52} ending {row['ending']!r:16} text "
                  f"{row['base']['text']:7.2f} -> {row['adapter']['text']:7.2f}   ending "
                  f"{row['base']['ending']:7.2f} -> {row['adapter']['ending']:7.2f}", flush=True)
        means = {f"{name}_{part}": statistics.fmean(row[name][part] for row in rows)
                 for name in ("base", "adapter") for part in ("text", "ending")} if rows else {}
        print(f"{split}: {len(rows)} of {len(examples)} episodes; mean log-prob of the text "
              f"{means.get('base_text', 0):.2f} -> {means.get('adapter_text', 0):.2f}, of its ending "
              f"{means.get('base_ending', 0):.2f} -> {means.get('adapter_ending', 0):.2f}")
        report[split] = {"episodes": len(examples), "rows": rows, "means": means}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
