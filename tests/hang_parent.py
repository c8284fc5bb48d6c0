"""A parent whose ranks hang: the signal tests kill it and watch the ranks go."""

import signal
import sys

import jobs

from distdoctor.launch.pool import launch

# Ctrl-C as at a terminal, even when whoever started the suite ran it in the background
# (a non-interactive shell starts background jobs with SIGINT ignored, and Python then
# never turns SIGINT into KeyboardInterrupt)
signal.signal(signal.SIGINT, signal.default_int_handler)
launch(jobs.announce_then_hang, world_size=int(sys.argv[1]), deadline=600)
