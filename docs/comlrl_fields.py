"""Regenerate the field tables of `docs/comlrl-users.md` from the CoMLRL layer's table: `python docs/comlrl_fields.py`
(`tests/test_docs.py` checks that they are up to date)."""

from pathlib import Path

from multiagent_trl.comlrl import IACConfig, MADPOConfig, MAGRPOConfig, MARLHFConfig
from multiagent_trl.comlrl.fields import render_docs

CONFIGS = {config.__name__: config for config in (MAGRPOConfig, IACConfig, MADPOConfig, MARLHFConfig)}

if __name__ == "__main__":
    page = Path(__file__).with_name("comlrl-users.md")
    page.write_text(render_docs(page.read_text(), CONFIGS))
