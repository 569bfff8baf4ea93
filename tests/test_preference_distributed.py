"""The preference family's pair stages under two processes (gloo on CPU, `tests/scripts/ddp_preference.py`): RLHF's
reward model is the same on every process, and iterative DPO and iterative RLHF run data-parallel, every process
holding the round's pairs from every prompt while training on its own share of them, and resume inside a round."""

import json
from collections import defaultdict
from pathlib import Path

import pytest

from .conftest import trained_ranks

SCRIPT = Path(__file__).parent / "scripts" / "ddp_preference.py"
ROWS = [f"Row {i}: say something." for i in range(7)]  # the script's prompts, uneven over the two processes
SHARES = ({0, 1, 2, 3}, {4, 5, 6})  # the rows each process plays (a row whose candidates all tie gives no pair)


def from_both_shares(prompts: list[str]) -> bool:
    """Whether pairs of `prompts` (in order) came from both processes' rows, in dataset order."""
    order = [ROWS.index(prompt) for prompt in prompts]
    return order == sorted(order) and all(set(order) & share for share in SHARES)


def shard(tmp_path, round_number: int) -> list[dict]:
    path = tmp_path / "run" / "preference_replay" / f"iteration_{round_number:04d}.json"
    return json.loads(path.read_text())["pairs"]


def length_reward(completions: list[str]) -> float:
    """The script's reward of one joint sample."""
    return float(len(completions[0]) + 2 * len(completions[1]))


@pytest.mark.parametrize("kind", ["rlhf", "actor_critic_rlhf"])
def test_rlhf_trains_one_reward_model_on_every_process(tmp_path, kind):
    """The ranks' random states part (the script seeds each its own way): each process trains its copy of the reward
    model on the gathered pairs, and every copy ends as the main process's, the one saved and resumed."""
    ranks = trained_ranks(SCRIPT, tmp_path, kind)
    assert ranks[0]["reward_model"] == ranks[1]["reward_model"], "the ranks score with different reward models"
    # Every process holds the pairs of both processes' prompts, in dataset order.
    assert ranks[0]["pair_prompts"] == ranks[1]["pair_prompts"]
    assert from_both_shares(ranks[0]["pair_prompts"])


@pytest.mark.parametrize("kind", ["iterative_dpo", "iterative_dpo_batches", "iterative_rlhf"])
def test_iterative_rounds_draw_every_prompt_and_train_data_parallel(tmp_path, kind):
    ranks = trained_ranks(SCRIPT, tmp_path, kind)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    # One shard a round with the pairs of both processes' prompts; the history comparator's round starts beside.
    expected = ["iteration_0001.json", "iteration_0002.json", "round_start_0001.pt", "round_start_0002.pt"]
    assert ranks[0]["replay"] == ranks[1]["replay"] == expected
    for round_number in (1, 2):
        pairs = shard(tmp_path, round_number)
        assert from_both_shares([pair["prompts"][0] for pair in pairs])
        for pair in pairs:  # each process's pairs carry its own samples' rewards
            assert pair["winner_reward"] == length_reward(pair["winner_completions"])
            assert pair["loser_reward"] == length_reward(pair["loser_completions"])
    rounds = [[{k: v for k, v in log.items() if k.startswith("round/")} for log in rank["logs"]] for rank in ranks]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 2  # the same rounds, of the same pairs, on both
    assert ranks[0]["round_pairs"] == ranks[1]["round_pairs"] != []  # the same replay draw, the main process's
    if kind == "iterative_rlhf":
        assert ranks[0]["reward_model"] == ranks[1]["reward_model"], "the ranks score with different reward models"
        return
    # Data parallel: each batch the processes build at once (keyed by the step it starts at: a generation batch, or
    # a micro-batch with `pair_batch_size`) holds different pairs of the round on each process.
    batches = [defaultdict(list), defaultdict(list)]
    for rank, by_step in zip(ranks, batches):
        for step, *pair in rank["served"]:
            by_step[step].append(json.dumps(pair))
    assert batches[0].keys() == batches[1].keys() and len(batches[0]) > 2
    for step in batches[0]:
        assert not set(batches[0][step]) & set(batches[1][step]), f"both processes trained the same pairs at {step}"


def test_iterative_rounds_resume_inside_a_round_on_two_processes(tmp_path):
    """A new trainer resumed from a checkpoint inside round 2 (of 3) reloads that round's shard on every process and
    draws round 3 against the round start it kept: both processes finish the run, with the same agents."""
    ranks = trained_ranks(SCRIPT, tmp_path, "iterative_resume")
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 12
    # Round 2 logged by the first run (step 5) and by the resumed one (its shard reloaded, step 7); round 3 drawn.
    assert [(log["round/index"], log["step"]) for log in ranks[0]["logs"]] == [(1, 1), (2, 5), (2, 7), (3, 9)]
    shards = [f"iteration_{r:04d}.json" for r in (1, 2, 3)]
    assert ranks[0]["replay"] == ranks[1]["replay"] == [*shards, "round_start_0002.pt", "round_start_0003.pt"]
