"""``python -m ppo_worker`` (inside the stage): the fork server that starts workers."""

from .zygote import main

main()
