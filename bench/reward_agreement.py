"""Does the trainer's reward order a round's samples as the simulated user would judge them?

    python bench/learning_loop.py --full --rounds 1 --user oneline --keep-data ...   # then:
    python bench/reward_agreement.py --data /tmp/squidcode-loop-XXXX --user oneline [--json out.json]

For a learning-loop run kept with `--keep-data`, this loads the round's training examples from its
feedback store as the trainer does, fits the user's preference on them, and for the first
`--examples` completion episodes samples `--group` answers each through the trainer's own sampling
path (`feedback.train.policy.sample_example`: the served prompt, the boundary rules, the served
token budget) with the base model. Each answer gets the trainer's reward (`episode_reward`) and the
simulated user's decision at that spot (`bench.simulated_user.decide`, the spot found again in the
standard library's copy of the module). It reports, per decision, how many answers and their mean
reward and P(kept), and over every pair of answers to one prompt that the user would judge
differently (keep above modify above revert or nothing), how often the reward orders them the same
way. A reward that orders them as the user does and a user who still does not learn points at the
policy's side (which tokens must change), not at the reward.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.simulated_user import USERS, Spot, decide, find_spots  # noqa: E402

RANK = {"keep": 2, "modify": 1, "revert": 0, "none": 0}


def stdlib_spot(group: str, following: tuple[str, ...]) -> Spot | None:
    """The spot an episode was about: the function named after `#` in its group, in the standard
    library's module of that file name (of two so named, the one followed by the lines the server
    saw after the cursor)."""
    import sysconfig

    uri, _, name = group.partition("#")
    path = Path(sysconfig.get_paths()["stdlib"]) / uri.rsplit("/", 1)[-1]
    if not name or not path.is_file():
        return None
    spots = [s for s in find_spots(path.read_text(encoding="utf-8"), path.name) if s.name == name]
    return max(spots, key=lambda s: s.after.split("\n")[: len(following)] == list(following), default=None)


def agreement(rows: list[dict]) -> dict:
    """Per decision: answers, mean reward, mean P(kept); and the pairs of one prompt's answers the
    user judges differently that the reward orders the same way."""
    summary = {}
    for decision in ("keep", "modify", "revert", "none"):
        of = [r for r in rows if r["decision"] == decision]
        scored = [r["p_kept"] for r in of if r["p_kept"] is not None]
        summary[decision] = {"answers": len(of),
                             "reward": round(statistics.mean(r["reward"] for r in of), 3) if of else None,
                             "p_kept": round(statistics.mean(scored), 3) if scored else None}
    same = opposite = 0
    prompts: dict[str, list[dict]] = {}
    for r in rows:
        prompts.setdefault(r["example"], []).append(r)
    for answers in prompts.values():
        for i, a in enumerate(answers):
            for b in answers[i + 1:]:
                user = RANK[a["decision"]] - RANK[b["decision"]]
                reward = a["reward"] - b["reward"]
                if user and reward:
                    same += (user > 0) == (reward > 0)
                    opposite += (user > 0) != (reward > 0)
    summary["pairs"] = {"same_order": same, "opposite": opposite,
                        "agreement": round(same / (same + opposite), 3) if same + opposite else None}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="a learning-loop data directory (kept with --keep-data)")
    parser.add_argument("--user", choices=sorted(USERS), required=True)
    parser.add_argument("--examples", type=int, default=16, help="completion episodes sampled")
    parser.add_argument("--group", type=int, default=8, help="answers sampled for each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import torch

    from context.config import load_file_config
    from feedback.preference import fit_preference
    from feedback.train.policy import example_prompt_ids, sample_example, served_prompt
    from feedback.train.service import _load_model, episode_reward, load_training_data
    from feedback.train.store_source import FeedbackStoreSource

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "feedback.db"  # a copy: the run's store is left as it was
        with sqlite3.connect(f"file:{args.data / 'feedback.db'}?mode=ro", uri=True) as source, \
                sqlite3.connect(db) as copy:
            source.backup(copy)
        config, _ = load_file_config([args.data / "workspace"])
        config = replace(config, feedback=replace(config.feedback, db_path=str(db)))
        train, _, _ = load_training_data(config.train, FeedbackStoreSource(db), [])
    fit = fit_preference(train)
    if fit.model is None:
        print(f"no preference to score with: {fit.reason}")
        return 1
    reward = episode_reward(fit, config.train.preference_weight)
    runtime = _load_model(config)
    torch.manual_seed(args.seed)
    rows = []
    examples = [e for e in train if e.prompt_text is not None][: args.examples]
    for example in examples:
        spot = stdlib_spot(example.group, served_prompt(example).following_lines)
        if spot is None:
            continue
        prompt = example_prompt_ids(runtime.tokenizer, example)
        group = sample_example(runtime.model, runtime.tokenizer, example, prompt, args.group,
                               config.train.max_new_tokens, config.train.temperature)
        for text in group.texts:
            shown = text[len(example.prompt_lead):]
            decision = decide(spot, shown, args.user).action if shown.strip() else "none"
            rows.append({"example": example.id, "spot": f"{spot.path}:{spot.name}", "decision": decision,
                         "reward": round(reward(text, example), 4),
                         "p_kept": round(fit.model.score(text), 4) if shown.strip() else None, "text": shown})
    summary = agreement(rows)
    print(f"{args.user}: {len({r['example'] for r in rows})} prompts x {args.group} answers, preference "
          f"{fit.reason}")
    for decision in ("keep", "modify", "revert", "none"):
        s = summary[decision]
        print(f"  {decision:6} {s['answers']:4} answers  reward {s['reward']}  P(kept) {s['p_kept']}")
    pairs = summary["pairs"]
    print(f"  pairs judged differently: the reward orders {pairs['same_order']} the user's way, "
          f"{pairs['opposite']} the other way (agreement {pairs['agreement']})")
    if args.json:
        args.json.write_text(json.dumps({"user": args.user, "data": str(args.data), "summary": summary,
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
