"""Did DDP stop because parameters got no gradient? Named per rank, from DDP's own error.

torch DDP without find_unused_parameters raises "Expected to have finished reduction in
the prior iteration" on the step after some parameters got no gradient, and lists them by
index ("Parameter indices which did not receive grad for rank 1: 2 3"); names appear only
under TORCH_DISTRIBUTED_DEBUG. Ranks run by distdoctor record their DDP's parameter names
in the reducer's order, so indices become names on every rank that raised. Runs that
record which parameters got no gradient before each sync (distdoctor's own training) are
left to the unused_params check, which reads that earlier and better evidence.
"""

from __future__ import annotations

import re

from distdoctor.checks import finding
from distdoctor.models import Finding, RunRecord
from distdoctor.models.calls import ranks_phrase

NAME = "ddp_reduction"
_MARK = "Expected to have finished reduction in the prior iteration"
_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): ([^\n]+)")
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


def check(record: RunRecord) -> list[Finding]:
    if any(rank.evidence.backward for rank in record.ranks):
        return []  # the ranks recorded missing gradients before the sync: unused_params reads that
    missing: dict[int, list[str]] = {}
    for rank in record.ranks:
        error = rank.end.error or ""
        if _MARK not in error:
            continue
        named = _NAMES.search(error)
        indexed = _INDICES.search(error)
        if named:
            missing[rank.rank] = sorted(n.strip() for n in named.group(2).split(","))
        elif indexed:
            params = rank.evidence.ddp_params
            missing[rank.rank] = [params[int(i)] if int(i) < len(params) else f"#{i}"
                                  for i in indexed.group(2).split()]
        else:
            missing[rank.rank] = []
    if not missing:
        return []
    listing = "; ".join(f"rank {r}: {', '.join(names) or 'unknown parameters'}"
                        for r, names in sorted(missing.items()))
    return [finding(
        "unused-params", check=NAME,
        headline=f"DDP: params without grad on {ranks_phrase(missing)}",
        symptom=f"DDP stopped with 'Expected to have finished reduction in the prior iteration': "
        f"parameters got no gradient in the previous step ({listing})",
        fix_changes={"knobs.find_unused_parameters": True}, ranks=sorted(missing),
        measured={"no_grad_params": {str(r): names for r, names in missing.items()}},
        fix="pass find_unused_parameters=True to DistributedDataParallel, or make every "
            "rank use every parameter in its loss", kind="unused-parameters")]
