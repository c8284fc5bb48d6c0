"""What the ranks print under ``distdoctor run``: whole lines, in order per rank, with
torchrun's --tee prefix and --local-ranks-filter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.tier("e2e")

SCRIPT = str(Path(__file__).parent / "chatty_ranks.py")
LINES = 500
LINE = re.compile(r"^(?:\[default(?P<tag>\d)\]:)?rank (?P<rank>\d) line (?P<i>\d+) "
                  r"loss (?P<loss>[\d.]+)$")


def printed(text: str) -> dict[int, list[tuple[str | None, int]]]:
    """The ``rank R line I`` lines per rank, as (prefix rank, I), in the order they came."""
    lines: dict[int, list] = {}
    for line in text.splitlines():
        found = LINE.match(line)
        if found:
            lines.setdefault(int(found["rank"]), []).append((found["tag"], int(found["i"])))
    return lines


def test_two_ranks_printing_at_once_give_whole_lines_in_order(distdoctor):
    done = distdoctor("run", "--nproc-per-node", "2", SCRIPT, str(LINES))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = printed(done.stdout)
    for rank in (0, 1):  # each line whole (the pattern ends at $), none lost, in order
        assert [i for _, i in lines[rank]] == list(range(LINES))
        assert all(tag is None for tag, _ in lines[rank])
        assert f"rank {rank} done\n" in done.stdout  # its newline added at the end
    notes = [line for line in done.stderr.splitlines() if " note " in line]
    assert sorted(notes) == sorted(f"rank {r} note {i}" for r in (0, 1)
                                   for i in range(0, LINES, 100))


def test_tee_prefixes_each_line_with_torchruns_tag(distdoctor):
    done = distdoctor("run", "--nproc-per-node", "2", "--tee", "3", SCRIPT, str(LINES))
    lines = printed(done.stdout)
    for rank in (0, 1):
        assert lines[rank] == [(str(rank), i) for i in range(LINES)]
        assert f"[default{rank}]:rank {rank} note 0\n" in done.stderr
    # a per-rank mapping, as torchrun's: rank 1's stdout prefixed, rank 0's bare
    done = distdoctor("run", "--nproc-per-node", "2", "--tee", "0:0,1:1", SCRIPT, "3")
    assert printed(done.stdout) == {0: [(None, i) for i in range(3)],
                                    1: [("1", i) for i in range(3)]}
    assert "rank 1 note 0\n" in done.stderr and "[default1]" not in done.stderr


def test_the_ranks_filter_shows_one_rank_and_the_diagnosis_still_reads_both(distdoctor):
    done = distdoctor("run", "--nproc-per-node", "2", "--local-ranks-filter", "1", SCRIPT,
                      "20")
    assert sorted(printed(done.stdout)) == [1]
    assert "rank 0 note" not in done.stderr and "rank 1 note 0" in done.stderr
    assert "all 2 ranks" in done.stdout and "ranks 0, 1: finished" in done.stdout


@pytest.mark.parametrize("argv, message", [
    (["--tee", "4"], "expected 0 (none), 1 (stdout), 2 (stderr), 3 (both)"),
    (["--tee", "0:1,x"], "got '0:1,x'"),
    (["--local-ranks-filter", "0,a"], "expected comma-separated ranks"),
    (["--local-ranks-filter", "2"], "names rank 2, but there are only 2 ranks"),
])
def test_bad_output_flags_are_one_line_and_exit_2(distdoctor, argv, message):
    done = distdoctor("run", "--nproc-per-node", "2", *argv, SCRIPT)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
