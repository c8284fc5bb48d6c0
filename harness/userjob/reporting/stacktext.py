"""A stopped rank's stacks as a user reads them: their own code, each thread once, by name.

A rank's stacks hold far more than the user's lines: torch's wrappers under every call,
distdoctor's own threads (the stack server, the stall watch), and, where a rank dumped at
its deadline and again when stopped, the same stacks twice. By default each distinct
thread is shown once, distdoctor's threads not at all, and only the frames of the user's
own code, with a count of what was left out; ``all_frames`` shows everything.
"""

from __future__ import annotations

from distdoctor.models import ThreadStack
from distdoctor.models.record import is_user_frame

OURS = "distdoctor-"  # how distdoctor's own threads are named


def stack_text(stacks: tuple[ThreadStack, ...], raw: str | None = None,
               all_frames: bool = False) -> str:
    """The text shown under a stopped rank; ``raw`` (faulthandler's) when none parsed."""
    if not stacks:
        return raw or ""
    shown: list[str] = []
    hidden_frames = hidden_threads = 0
    seen: set = set()
    for stack in stacks:
        if stack in seen:
            continue
        seen.add(stack)
        if stack.name.startswith(OURS) and not all_frames:
            hidden_threads += 1
            continue
        frames = stack.frames if all_frames else tuple(f for f in stack.frames
                                                       if is_user_frame(f))
        if not frames and not stack.main and not all_frames:
            hidden_threads += 1  # a thread of torch's or the runtime's, none of it theirs
            continue
        hidden_frames += len(stack.frames) - len(frames)
        shown.append(str(ThreadStack(stack.name, stack.main, frames)))
    left = []
    if hidden_frames:
        left.append(f"{hidden_frames} frame{'s' * (hidden_frames != 1)} of torch, Python "
                    f"and distdoctor")
    if hidden_threads:
        left.append(f"{hidden_threads} thread{'s' * (hidden_threads != 1)} with none of "
                    f"your code")
    if left:
        shown.append(f"({' and '.join(left)} not shown; --all-frames shows them)")
    return "\n".join(shown)
