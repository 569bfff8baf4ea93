"""The preference family's pure-data core (CoMLRL's MADPO and MARLHF; no trainer yet): pair selection from a joint
reward (`pairs`), MADPO's joint-factorised DPO loss and the Bradley-Terry reward-model loss (`losses`), and MARLHF's
joint reward model, a causal LM with a scalar head over every agent's text (`reward_model`). Each is checked against
CoMLRL 1.4.3's own code in `tests/test_preference_math.py`; the trainers that hold state and call these come next.
"""
