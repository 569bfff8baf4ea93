"""Tools and environments for a team (`environments`), and the tiny tool-calling test model (`testing`)."""

from .environments import SharedEnvironment, shared_environment

__all__ = ["SharedEnvironment", "shared_environment"]
