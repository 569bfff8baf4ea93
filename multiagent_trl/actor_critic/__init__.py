"""The actor-critic family (CoMLRL's IAC and MAAC): value models (`value_model`) and the estimators of advantages,
TD targets and losses as pure functions on tensors (`estimators`)."""
