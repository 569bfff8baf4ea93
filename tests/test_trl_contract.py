"""The contract with the installed TRL: every attribute `GRPOTrainer` sets is sorted into per-agent, shared or unused
state (`multiagent_trl/team/views.py`), and `GRPOTrainer._generate` returns the fields `Rollout` names, in order.

A TRL upgrade that adds state or reorders its rollout fails here, by name, instead of silently sharing one agent's
state with another or passing wrong values along.
"""

import ast
import dataclasses
import inspect
import textwrap

import pytest
import transformers
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.base_trainer import _BaseTrainer

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.rollout.replay import Rollout
from multiagent_trl.team.views import PER_AGENT, SHARED, UNUSED_BY_TEAMS

from .conftest import length_ratio, small_args

WHERE = "multiagent_trl/team/views.py"
SORTED = {**PER_AGENT, **SHARED, **UNUSED_BY_TEAMS}


def assigned_attributes(cls) -> set[str]:
    """Every `self.<name>` that a method of `cls` (its own source, not its bases') assigns."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for sub in ast.walk(target) if target is not None else ():
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    names.add(sub.attr)
    return names


TRL_ATTRIBUTES = assigned_attributes(GRPOTrainer) | assigned_attributes(_BaseTrainer)
TRAINER_ATTRIBUTES = assigned_attributes(transformers.Trainer)


def test_the_three_lists_do_not_overlap():
    lists = {"PER_AGENT": PER_AGENT, "SHARED": SHARED, "UNUSED_BY_TEAMS": UNUSED_BY_TEAMS}
    for a, first in lists.items():
        for b, second in lists.items():
            if a < b:
                assert not first.keys() & second.keys(), f"{sorted(first.keys() & second.keys())} in {a} and {b}"


def test_every_attribute_grpo_trainer_sets_is_sorted():
    unsorted = sorted(TRL_ATTRIBUTES - TRAINER_ATTRIBUTES - SORTED.keys())
    assert not unsorted, (
        f"TRL's GRPOTrainer sets {unsorted}, which {WHERE} does not sort. Add each to PER_AGENT (one value per agent, "
        "swapped in by the agent view), SHARED (one value for the team) or UNUSED_BY_TEAMS (a feature teams reject), "
        "with the reason."
    )


def test_every_sorted_attribute_is_still_set_by_trl():
    stale = sorted(SORTED.keys() - TRL_ATTRIBUTES - TRAINER_ATTRIBUTES)
    assert not stale, f"{WHERE} sorts {stale}, which TRL no longer sets: remove them (or find their new names)."


def test_a_constructed_grpo_trainer_has_no_unsorted_attribute(tmp_path, tiny_path, prompts_dataset):
    # Catches attributes set outside the class body's `self.x = ...` (helpers, `setattr`).
    trainer = GRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=GRPOConfig(output_dir=str(tmp_path), bf16=False, report_to="none", num_generations=4),
        train_dataset=prompts_dataset,
    )
    unsorted = sorted(set(vars(trainer)) - TRAINER_ATTRIBUTES - SORTED.keys())
    assert not unsorted, f"GRPOTrainer instances carry {unsorted}, which {WHERE} does not sort."


def test_every_agent_view_holds_exactly_the_per_agent_attributes(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2),
        train_dataset=prompts_dataset,
    )
    for view in trainer._agent_views:
        assert view.keys() == PER_AGENT.keys()
    # Buffers are each agent's own objects, and not the trainer's (which holds the team's joint values).
    for name in ("_metrics", "_logs", "_pending_metrics", "_pending_extra_logs"):
        objects = [id(view[name]) for view in trainer._agent_views] + [id(getattr(trainer, name))]
        assert len(set(objects)) == 3, name


def _returned_names(function) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    returns = [node for node in ast.walk(tree) if isinstance(node, ast.Return) and node.value is not None]
    assert len(returns) == 1, "GRPOTrainer._generate has more than one return: check what each returns"
    return [element.id for element in returns[0].value.elts]


def test_rollout_fields_are_what_grpo_trainer_generate_returns_in_order():
    assert [f.name for f in dataclasses.fields(Rollout)] == _returned_names(GRPOTrainer._generate)


def test_a_rollout_of_the_wrong_length_is_refused():
    with pytest.raises(RuntimeError, match="returned 7 values"):
        Rollout.from_trl(tuple(range(7)))
    rollout = Rollout.from_trl(tuple(range(8)))
    assert rollout.completions == 3 and rollout.to_trl() == tuple(range(8))
