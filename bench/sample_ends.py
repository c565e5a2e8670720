"""How the trainer's sampled suggestions end, at the learning loop's training spots (issue 26).

The spots of `bench/learning_loop.py` (function bodies of the standard-library copy, 48 of them
spread over the training modules), each prompted as the loop's server prompts it (the last 256
tokens before the cursor, token healing, the text after the cursor for the boundary rules; no Squid
references), sampled as the trainer samples a group (`feedback.train.policy.sample_example`:
temperature 1.0, 32 tokens and 32 more to finish what a suggestion opened). Counted: suggestions by
their number of lines, groups holding a single-line one, and, of those single lines, how many the
model ended itself (a dedent, a second blank line, its end-of-sequence token: the tokens that stay
in the loss, `context.boundary.boundary_cut`) and how many the token budget ended (the unfinished
next line dropped).

    python bench/sample_ends.py [--spots 24] [--group 4] [--threads 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from learning_loop import Plan, pick  # noqa: E402
from simulated_user import TRAINING_MODULES, copy_modules, find_spots  # noqa: E402

PREFIX_TOKENS = 256  # the loop's `completion.prefix_tokens`


def count(model, tokenizer, spots, group_size: int, max_new_tokens: int) -> collections.Counter:
    from context.prompt_record import ServedPrompt
    from feedback.train.dataset import TrainingExample
    from feedback.train.policy import (
        completion_prompt,
        eos_token_ids,
        example_prompt_ids,
        sample_example,
        shown_suggestion,
    )

    eos = eos_token_ids(model, tokenizer)
    counts: collections.Counter = collections.Counter()
    for spot in spots:
        served = ServedPrompt.from_text(spot.before, prefix_tokens=PREFIX_TOKENS,
                                        following_lines=tuple(spot.after.split("\n")[1:9]))
        prompt_text = spot.before.rstrip(" ")
        example = TrainingExample(id=spot.name, created_at=0.0, instruction="", original="",
                                  prompt_text=prompt_text, prompt_lead=spot.before[len(prompt_text):],
                                  kept_text=None, served=served, language="python")
        prompt = example_prompt_ids(tokenizer, example)
        _, heal = completion_prompt(tokenizer, example)
        group = sample_example(model, tokenizer, example, prompt, group_size, max_new_tokens, 1.0)
        singles = 0
        for row in group.completions.tolist():
            first_eos = next((i for i, token in enumerate(row) if token in eos), None)
            ids = row[: first_eos + 1] if first_eos is not None else row
            shown, decided = shown_suggestion(tokenizer, ids, first_eos, heal, max_new_tokens,
                                              served.finish_tokens, served.cursor_context(),
                                              served.max_lines, "python")
            lines = sum(1 for line in shown.split("\n") if line.strip())
            counts[f"suggestions with {min(lines, 3)}{' or more' if lines >= 3 else ''} line(s)"] += 1
            if lines == 1:
                singles += 1
                counts["single lines ended by the model" if decided is not None
                       else "single lines ended by the token budget"] += 1
        counts["groups with a single-line suggestion"] += singles > 0
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spots", type=int, default=24, help="the first N of the loop's 48 training spots")
    parser.add_argument("--group", type=int, default=4, help="samples per spot (the trainer's group size)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    from context.config import ModelConfig
    from context.runtime import ModelRuntime

    torch.manual_seed(args.seed)
    runtime = ModelRuntime(ModelConfig(threads=args.threads)).load()
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        copy_modules(workspace, TRAINING_MODULES)
        spots = [s for m in TRAINING_MODULES for s in find_spots((workspace / m).read_text(), m)]
    spots = pick(spots, 48)[: args.spots]
    counts = count(runtime.model, runtime.tokenizer, spots, args.group, Plan.max_new_tokens)
    print(f"{len(spots)} spots x {args.group} samples, seed {args.seed}")
    for key, value in sorted(counts.items()):
        print(f"- {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
