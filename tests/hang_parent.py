"""A parent whose ranks hang: the signal tests kill it and watch the ranks go."""

import sys

import jobs
from harness.pool import launch

launch(jobs.announce_then_hang, world_size=int(sys.argv[1]), deadline=600)
