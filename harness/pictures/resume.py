"""resume-check's report as one HTML page: the verdict, what differs first (with its step,
ranks and numbers), and where the checkpoint was saved, loaded and an RNG state set."""

from __future__ import annotations

from distdoctor.analysis.resume import Resumption
from distdoctor.pictures.page import Section, finding, page, paragraph, table, verdict


def resume_page(found: Resumption, command: str) -> str:
    """The page for one resume-check."""
    head = verdict(f"{'OK' if found.ok else 'FAILED'}: "
                   f"{'resumed like the run that never stopped' if found.ok else found.kind}",
                   "good" if found.ok else "bad")
    told = paragraph(found.summary) if found.ok else \
        finding(found.kind, found.summary, found.fix)
    sections = [Section("Verdict", "verdict-section", head + told)]
    compared = [["checkpoint written after step", str(found.checkpoint_step)]]
    if found.compared_steps != (0, 0):
        compared.append(["steps compared", "{}-{}".format(*found.compared_steps)])
    if found.ranks:
        compared.append(["ranks that differ", ", ".join(map(str, found.ranks))])
    compared += [[key, str(value)] for key, value in found.measured.items()
                 if key not in ("ranks",)]
    sections.append(Section("What was compared", "compared", table(["", ""], compared)))
    if found.lines:
        sections.append(Section("Where it was saved and restored", "lines",
                                table(["line"], [[line] for line in found.lines])))
    return page(f"distdoctor resume-check: {command}",
                "a run stopped after a checkpoint and resumed, against the same run never "
                "stopped", sections)
