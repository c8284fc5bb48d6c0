"""The line a crash report points at is the user's: never distdoctor's own files, torch's,
Python's, or the environment's entry script (issue 35: a rank gloo aborted was reported
at .venv/bin/distdoctor:8)."""

from __future__ import annotations

import os
import sysconfig

import pytest

from distdoctor.userjob.reporting.report import raising_line

pytestmark = pytest.mark.tier("unit")

ENTRY = os.path.join(sysconfig.get_path("scripts"), "distdoctor")
TORCH = os.path.join(sysconfig.get_path("purelib"), "torch", "distributed", "tensor", "_api.py")


def test_a_traceback_points_at_its_innermost_user_frame():
    error = (f'Traceback (most recent call last):\n  File "{ENTRY}", line 8, in <module>\n'
             f'  File "/home/me/train.py", line 22, in <module>\n'
             f'  File "/home/me/ckpt.py", line 5, in save\n'
             f'  File "{TORCH}", line 571, in full_tensor\nRuntimeError: boom\n')
    assert raising_line(error) == "/home/me/ckpt.py:5"


def test_a_faulthandler_dump_is_read_innermost_first():
    """What a rank that gloo aborted leaves: "most recent call first", the entry script
    last. Its innermost user frame is the first one, not the entry script's."""
    dump = ("Fatal Python error: Aborted\n\nThread 0x00007f (most recent call first):\n"
            f'  File "{TORCH}", line 571 in full_tensor\n'
            '  File "/home/me/train.py", line 22 in <dictcomp>\n'
            '  File "/home/me/train.py", line 22 in <module>\n'
            f'  File "{os.path.dirname(os.__file__)}/runpy.py", line 291 in run_path\n'
            f'  File "{ENTRY}", line 8 in <module>\n')
    assert raising_line(dump) == "/home/me/train.py:22"
    assert raising_line(f'  File "{ENTRY}", line 8 in <module>\n') is None
