"""ppo-grade: numerical grading of the five PPO exercises against the hidden reference."""

__version__ = "0.1.0"
