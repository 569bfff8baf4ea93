"""The CoMLRL layer's field table (`multiagent_trl.comlrl.fields`) is what the configs check: every limit in it
raises, naming the field, one below the limit."""

import dataclasses

import pytest
import torch
from transformers import HfArgumentParser

from multiagent_trl.comlrl import IACConfig, MAACConfig, MADPOConfig, MAGRPOConfig, MARLHFConfig
from multiagent_trl.comlrl.fields import FAMILIES
from multiagent_trl.rollout.evaluation import EvalTrajectories, row_logger_metrics

CONFIGS = {
    "MAGRPOConfig": MAGRPOConfig,
    "IACConfig": IACConfig,
    "MADPOConfig": MADPOConfig,
    "MARLHFConfig": MARLHFConfig,
}
LIMITED = [
    (family, row)
    for family, rows in FAMILIES.items()
    for row in rows
    if row.minimum is not None or row.choices or row.positive
]


@pytest.mark.parametrize(("family", "row"), LIMITED, ids=[f"{f}.{r.name}" for f, r in LIMITED])
def test_every_limit_in_the_table_is_checked(family, row):
    value = "bogus" if row.choices else 0 if row.positive else row.minimum - 1
    with pytest.raises(ValueError, match=f"`{row.name}` must be"):
        CONFIGS[family](**{row.name: value}, report_to="none")


def test_choices_are_read_case_insensitively():
    assert MAGRPOConfig(advantage_mode="RLOO", parallel_training="None").parallel_training == "none"
    assert MAACConfig(parallel_training="null").parallel_training == "none"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_command_line_help_of_each_field_is_its_table_row(family):
    """`--help` (HfArgumentParser reads the fields' `help`) says what each CoMLRL field becomes here: its row."""
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(CONFIGS[family])}
    for row in FAMILIES[family]:
        assert row.native in helps[row.name], row.name
    HfArgumentParser(CONFIGS[family]).format_help()  # and the parser takes them


def test_eval_logger_metrics_are_aggregated_and_checked():
    trajectories = EvalTrajectories(1, rows=[{"prompt": "a"}, {"prompt": "b"}], rewards=[[1.0], [2.0]])
    trajectories.completions = [[["x"], ["yy"]]]

    def row_logger(agent_completions_turns, batch_items, prompts):
        return [{"length": len(turns[0])} for turns in agent_completions_turns[0]]

    def mean(per_row, num_turns):
        return {"length_mean": torch.tensor(sum(m["length"] for m in per_row) / len(per_row))}

    assert row_logger_metrics(row_logger, mean, trajectories, 1) == {"length_mean": 1.5}
    with pytest.raises(TypeError, match="finite numbers"):
        row_logger_metrics(row_logger, lambda per_row, num_turns: {"bad": float("nan")}, trajectories, 1)
