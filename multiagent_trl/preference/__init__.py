"""The preference family (CoMLRL's MADPO and MARLHF): pair selection from a joint reward (`pairs`), MADPO's
joint-factorised DPO loss and the Bradley-Terry reward-model loss (`losses`), MARLHF's joint reward model
(`reward_model`), each checked against CoMLRL 1.4.3's own code in `tests/test_preference_math.py`, MARLHF's
reward-model stage (`reward_training`: pairs of joint samples, Bradley-Terry training; `sampling` draws the pairs
from a team's task reward), and the trainers that hold state and call them: `MultiAgentDPOConfig` /
`MultiAgentDPOTrainer` (`config`, `trainer`), its iterative form over rounds of pairs against a comparator with replay
(`iterative`, `replay`), `MultiAgentRLHFConfig` / `MultiAgentRLHFTrainer` (`rlhf`: a team trained on a joint reward
model's scores and evaluated on the task reward), its actor-critic form (`rlhf_actor_critic`) and its iterative form
in the same rounds (`iterative_rlhf`). CoMLRL's names (`MADPOConfig`, `MADPOTrainer`, `MARLHFConfig`,
`MARLHFTrainer`, a translation onto `rlhf`) are in `multiagent_trl.comlrl` (and the package root); this package
imports nothing from that layer.
"""

from .config import MultiAgentDPOConfig
from .iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from .iterative_rlhf import MultiAgentIterativeRLHFConfig, MultiAgentIterativeRLHFTrainer
from .reward_model import JointRewardModel, joint_text
from .reward_training import JointPreferencePair, train_reward_model
from .rlhf import MultiAgentRLHFConfig, MultiAgentRLHFTrainer
from .rlhf_actor_critic import ActorCriticRLHFConfig, ActorCriticRLHFTrainer
from .sampling import collect_preference_pairs
from .trainer import MultiAgentDPOTrainer

__all__ = [
    "ActorCriticRLHFConfig",
    "ActorCriticRLHFTrainer",
    "JointPreferencePair",
    "JointRewardModel",
    "MultiAgentDPOConfig",
    "MultiAgentDPOTrainer",
    "MultiAgentIterativeDPOConfig",
    "MultiAgentIterativeDPOTrainer",
    "MultiAgentIterativeRLHFConfig",
    "MultiAgentIterativeRLHFTrainer",
    "MultiAgentRLHFConfig",
    "MultiAgentRLHFTrainer",
    "collect_preference_pairs",
    "joint_text",
    "train_reward_model",
]
