"""What one step plays: the rollout tree, turns, generation and sampling, and replaying it to TRL."""
