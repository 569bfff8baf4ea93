"""Damaged saved folders are refused at load, naming the file, before any weight is overwritten.

One table over every trainer family that saves folders: MAGRPO's team checkpoint, the actor-critic trainers (IAC's
critics in `agent_i/critic/`, MAAC's joint `critic/`), MADPO, and MARLHF with its reward model. Each checkpoint is
written once (a real training step and `save_checkpoint`); each case damages a copy (a file removed, or cut to half
its size) and loads it into a fresh trainer whose weights were moved away from the checkpoint's, so that any load
would show.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from multiagent_trl import (
    IACConfig,
    IACTrainer,
    JointRewardModel,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MARLHFConfig,
    MARLHFTrainer,
)
from multiagent_trl.preference.reward_model import REWARD_HEAD_FILE
from multiagent_trl.testing import tiny_model_path, tiny_tokenizer

from .test_actor_critic import parity_reward

PROMPTS = ["Write a title:", "Name a planet:", "Describe a cloud:", "Tell a joke:"]


def length_ratio(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def dataset() -> Dataset:
    return Dataset.from_dict({"prompt": PROMPTS})


def magrpo(out: str):
    args = MAGRPOConfig(
        output_dir=out, num_turns=1, max_new_tokens=4, rollout_buffer_size=2, agent_learning_rate=1e-3,
        max_steps=1, report_to="none", seed=0,
    )  # fmt: skip
    return MAGRPOTrainer(agent_model=tiny_model_path(), reward_func=length_ratio, args=args, train_dataset=dataset())


def actor_critic(config_class, trainer_class, critic_type: str = "v"):
    def build(out: str):
        args = config_class(
            num_turns=1, num_generations=2, rollout_buffer_size=4, max_new_tokens=4, num_train_epochs=1,
            agent_learning_rate=1e-3, eval_interval=0, report_to="none", output_dir=out, critic_type=critic_type,
        )  # fmt: skip
        path = tiny_model_path()
        return trainer_class(
            agent_model=path, critic_model=path, reward_func=parity_reward, args=args, train_dataset=dataset()
        )

    return build


def madpo(out: str):
    args = MADPOConfig(
        num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=4,
        rollout_buffer_size=2, eval_interval=0, report_to="none", output_dir=out,
    )  # fmt: skip
    return MADPOTrainer(agent_model=tiny_model_path(), reward_func=length_ratio, args=args, train_dataset=dataset())


def marlhf(out: str):
    args = MARLHFConfig(
        output_dir=out, report_to="none", num_train_epochs=1, max_new_tokens=4, num_generations=2,
        preference_num_candidates=4, rollout_buffer_size=2, eval_interval=0, reward_learning_rate=1e-3,
    )  # fmt: skip
    return MARLHFTrainer(agent_model=tiny_model_path(), reward_func=length_ratio, args=args, train_dataset=dataset())


FAMILIES = {
    "magrpo": magrpo,
    "iac": actor_critic(IACConfig, IACTrainer),
    "maac": actor_critic(MAACConfig, MAACTrainer),
    "madpo": madpo,
    "marlhf": marlhf,
}

# (family, file in its checkpoint): a weight of the last agent (so that the first one would be loaded already), the
# training state, and each family's own parts.
CASES = [
    ("magrpo", "agent_1/model.safetensors"),
    ("magrpo", "agent_1/config.json"),
    ("magrpo", "optimizer.pt"),
    ("magrpo", "scheduler.pt"),
    ("magrpo", "rng_state.pth"),
    ("magrpo", "trainer_state.json"),
    ("iac", "agent_1/critic/value_head.pt"),
    ("iac", "agent_1/critic/model.safetensors"),
    ("maac", "critic/value_head.pt"),
    ("maac", "critic/model.safetensors"),
    ("madpo", "agent_1/model.safetensors"),
    ("madpo", "optimizer.pt"),
    ("marlhf", "reward_model/" + REWARD_HEAD_FILE),
    ("marlhf", "reward_model/model.safetensors"),
    ("marlhf", "reward_model/tokenizer.json"),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each family's checkpoint after one training run, built on first use."""
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            root = tmp_path_factory.mktemp(family)
            trainer = FAMILIES[family](str(root / "run"))
            trainer.train()
            built[family] = trainer.save_checkpoint(str(root / "checkpoint"))
        return built[family]

    return get


def damage(folder: Path, name: str, how: str) -> None:
    path = folder / name
    assert path.is_file(), f"the checkpoint has no {name}: {sorted(os.listdir(path.parent))}"
    if how == "missing":
        path.unlink()
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def weights(trainer) -> dict[str, torch.Tensor]:
    """Every weight a load could touch: the team (with its critics) and MARLHF's reward model."""
    state = {f"model.{k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    reward_model = getattr(trainer, "reward_model", None)
    if reward_model is not None:
        state.update({f"reward_model.{k}": v.detach().clone() for k, v in reward_model.state_dict().items()})
    return state


@pytest.mark.parametrize("how", ["missing", "truncated"])
@pytest.mark.parametrize("family, name", CASES)
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_loads_nothing(checkpoints, tmp_path, family, name, how):
    folder = tmp_path / "checkpoint"
    shutil.copytree(checkpoints(family), folder)
    damage(folder, name, how)
    fresh = FAMILIES[family](str(tmp_path / "fresh"))
    with torch.no_grad():  # away from the checkpoint's weights, so that any overwrite shows
        for p in fresh.model.parameters():
            p.add_(0.25)
    before = weights(fresh)
    with pytest.raises((FileNotFoundError, ValueError), match=os.path.basename(name).replace(".", r"\.")) as error:
        fresh.load_checkpoint(str(folder))
    assert str(folder) in str(error.value) or name in str(error.value)
    after = weights(fresh)
    assert after.keys() == before.keys()
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert fresh.pending_checkpoint is None  # the next `train()` does not resume from it either


def test_an_intact_checkpoint_still_loads(checkpoints, tmp_path):
    """The same checks pass on what the trainers write (the table's checkpoints, undamaged)."""
    for family in FAMILIES:
        fresh = FAMILIES[family](str(tmp_path / family))
        fresh.load_checkpoint(checkpoints(family))
        assert fresh.pending_checkpoint == checkpoints(family)


# ---------------------------------------------------------------------------------------------- the helper


def test_check_saved_file_names_each_kind_of_damage(tmp_path):
    from multiagent_trl.team.folders import check_folder, check_saved_file

    (tmp_path / "state.json").write_text('{"a": ')
    torch.save({"x": torch.ones(3)}, tmp_path / "ok.pt")
    data = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:-10])
    check_saved_file(str(tmp_path / "ok.pt"))
    for name in ("state.json", "cut.pt", "absent.safetensors"):
        with pytest.raises((FileNotFoundError, ValueError), match=name.replace(".", r"\.")):
            check_saved_file(str(tmp_path / name))
    with pytest.raises(ValueError, match=r"cut\.pt"):
        check_folder(str(tmp_path))  # every file in the folder is read (in name order)
    (tmp_path / "cut.pt").unlink()
    with pytest.raises(ValueError, match=r"state\.json"):
        check_folder(str(tmp_path))


# ---------------------------------------------------------------------------------------------- the reward model


def reward_model() -> JointRewardModel:
    from transformers import AutoModelForCausalLM

    return JointRewardModel(AutoModelForCausalLM.from_pretrained(tiny_model_path()), tiny_tokenizer())


@pytest.mark.parametrize("name", [REWARD_HEAD_FILE, "model.safetensors", "tokenizer.json", "tokenizer_config.json"])
def test_a_reward_model_folder_missing_a_part_is_refused_naming_it(tmp_path, name):
    reward_model().save_pretrained(str(tmp_path / "rm"))
    (tmp_path / "rm" / name).unlink()
    with pytest.raises(FileNotFoundError, match=name.replace(".", r"\.")):
        JointRewardModel.from_pretrained(str(tmp_path / "rm"))


def test_a_plain_causal_lm_gets_a_new_head_only_when_asked(tmp_path):
    with pytest.raises(FileNotFoundError, match="from_causal_lm"):
        JointRewardModel.from_pretrained(tiny_model_path())
    model = JointRewardModel.from_causal_lm(tiny_model_path(), max_length=32)
    assert model.max_length == 32 and model.tokenizer is not None


def test_reward_model_saves_are_atomic_and_marked_complete(tmp_path):
    model = reward_model()
    folder = tmp_path / "rm"
    model.save_pretrained(str(folder))
    marker = json.loads((folder / "joint_reward_model.json").read_text())
    assert REWARD_HEAD_FILE in marker["files"] and "model.safetensors" in marker["files"]
    assert sorted(os.listdir(tmp_path)) == ["rm"]  # no staging folder left beside it
    with torch.no_grad():
        model.reward_head.weight.add_(1.0)
    model.save_pretrained(str(folder))  # replaces the earlier save
    loaded = JointRewardModel.from_pretrained(str(folder))
    torch.testing.assert_close(loaded.reward_head.weight, model.reward_head.weight)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes"):
        model.save_pretrained(str(tmp_path / "other"))  # not a reward model's folder: nothing replaced


# ---------------------------------------------------------------------------------------------- critic types


def test_a_v_critic_checkpoint_is_refused_by_a_q_critic_trainer(checkpoints, tmp_path):
    q_trainer = actor_critic(MAACConfig, MAACTrainer, critic_type="q")(str(tmp_path / "q"))
    before = weights(q_trainer)
    with pytest.raises(ValueError, match=r"critic_type='q'.*'v'"):
        q_trainer.load_checkpoint(checkpoints("maac"))
    after = weights(q_trainer)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
