"""The CoMLRL layer's field table (`multiagent_trl.comlrl.fields`) is what the configs check: every limit in it
raises, naming the field, one below the limit."""

import pytest

from multiagent_trl.comlrl import IACConfig, MAACConfig, MADPOConfig, MAGRPOConfig
from multiagent_trl.comlrl.fields import FAMILIES

CONFIGS = {"MAGRPOConfig": MAGRPOConfig, "IACConfig": IACConfig, "MADPOConfig": MADPOConfig}
LIMITED = [
    (family, row) for family, rows in FAMILIES.items() for row in rows if row.minimum is not None or row.choices
]


@pytest.mark.parametrize(("family", "row"), LIMITED, ids=[f"{f}.{r.name}" for f, r in LIMITED])
def test_every_limit_in_the_table_is_checked(family, row):
    value = "bogus" if row.choices else row.minimum - 1
    with pytest.raises(ValueError, match=f"`{row.name}` must be"):
        CONFIGS[family](**{row.name: value}, report_to="none")


def test_choices_are_read_case_insensitively():
    assert MAGRPOConfig(advantage_mode="RLOO", parallel_training="None").parallel_training == "none"
    assert MAACConfig(parallel_training="null").parallel_training == "none"
