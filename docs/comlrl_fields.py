"""Regenerate the field tables of `docs/comlrl-users.md` from the CoMLRL layer's table (`multiagent_trl.comlrl.fields`)
with the configs' defaults: `python docs/comlrl_fields.py` (`tests/test_docs.py` checks that they are up to date)."""

import dataclasses
import re
from pathlib import Path

from multiagent_trl.comlrl import IACConfig, MADPOConfig, MAGRPOConfig, MARLHFConfig
from multiagent_trl.comlrl.fields import FAMILIES

CONFIGS = {config.__name__: config for config in (MAGRPOConfig, IACConfig, MADPOConfig, MARLHFConfig)}
BLOCK = re.compile(r"(<!-- fields: (\w+) -->\n)(?:.*?\n)??(<!-- /fields -->)", re.S)


def fields_table(config: type) -> str:
    """The rows of `config`'s family (`FAMILIES[config.__name__]`) as a markdown table, with `config`'s defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    lines = ["| CoMLRL field | default | here | limit |", "| --- | --- | --- | --- |"]
    for row in FAMILIES[config.__name__]:
        limit = " / ".join(f"`{c}`" for c in row.choices) or ("" if row.minimum is None else f">= {row.minimum:g}")
        limit = "> 0" if row.positive else limit
        lines.append(f"| `{row.name}` | `{defaults[row.name]!r}` | {row.native} | {limit} |")
    return "\n".join(lines)


def render(text: str) -> str:
    """`text` with every `<!-- fields: Name -->` ... `<!-- /fields -->` block regenerated from `CONFIGS[Name]`."""
    return BLOCK.sub(lambda m: m.group(1) + fields_table(CONFIGS[m.group(2)]) + "\n" + m.group(3), text)


if __name__ == "__main__":
    page = Path(__file__).with_name("comlrl-users.md")
    page.write_text(render(page.read_text()))
