"""The run data model: what goes into a run (spec), what ranks record (evidence, record),
what checks conclude (verdict).

Everything here is a frozen dataclass that survives a JSON round trip, so a record written
by one run (or one machine) can be re-checked later by a newer detector without re-running.
A fault changes a RunSpec's knobs and nothing else; a check reads a RunRecord and nothing
else. Bump SCHEMA_VERSION whenever a field changes meaning. Beside the dataclasses: the
one vocabulary of calls (``calls``: what is point-to-point, how a call and a set of ranks
are written), the events' names (``events``), every default deadline (``deadlines``),
strategy names (``strategies``) and the JSON codec (``jsoncodec``). Algorithms over these
records (the wait-for proof, sequence matching, statistics) are in ``analysis``.

It imports nothing of the project, torch included, and every other package imports it.
"""

from distdoctor.models.evidence import (
                                     Arrival,
                                     BackwardEvidence,
                                     BatchEvidence,
                                     BufferEvidence,
                                     Call,
                                     ClearedGradients,
                                     DDPForward,
                                     Evidence,
                                     Fingerprint,
                                     GapSample,
                                     GradientEvidence,
                                     GroupTensor,
                                     GroupTraffic,
                                     Incomplete,
                                     MemoryEvidence,
                                     NonFiniteEvidence,
                                     OptimizerEvidence,
                                     Phase,
                                     PipeStepEvidence,
                                     RestartEvidence,
                                     SkippedStep,
                                     StageCost,
                                     StageEvent,
                                     Startup,
                                     StepEvidence,
)
from distdoctor.models.record import (
                                     SCHEMA_VERSION,
                                     Frame,
                                     InFlight,
                                     RankEnd,
                                     RankRecord,
                                     RankStatus,
                                     Recorded,
                                     RunRecord,
                                     Seen,
                                     ThreadStack,
                                     seen_most_first,
)
from distdoctor.models.spec import (
                                     AuxSkip,
                                     Knobs,
                                     OptimizerName,
                                     P2POrder,
                                     PipeShape,
                                     RunSpec,
                                     SamplerKind,
                                     StageSplit,
                                     apply_changes,
)
from distdoctor.models.verdict import (
                                     REPORT_SCHEMA,
                                     Assessment,
                                     CauseKind,
                                     Finding,
                                     Outcome,
                                     ReferenceComparison,
                                     RunReport,
                                     Verdict,
                                     dump_report,
                                     load_report,
)

__all__ = [
    "Arrival", "AuxSkip", "Assessment", "GapSample", "Phase", "CauseKind", "BackwardEvidence",
    "Startup",
    "BatchEvidence",
    "BufferEvidence", "OptimizerEvidence", "Call", "DDPForward", "SkippedStep", "ClearedGradients",
    "Evidence",
    "Fingerprint", "Finding", "Frame", "GradientEvidence", "GroupTensor", "GroupTraffic",
    "Incomplete", "Knobs", "MemoryEvidence", "RestartEvidence",
    "NonFiniteEvidence", "OptimizerName", "Outcome", "P2POrder",
    "InFlight", "PipeShape", "PipeStepEvidence", "REPORT_SCHEMA", "RankEnd", "RankRecord",
    "Recorded", "RankStatus",
    "ReferenceComparison", "RunRecord", "RunReport", "RunSpec", "SCHEMA_VERSION", "Seen",
    "SamplerKind", "StageCost", "StageEvent", "StageSplit", "StepEvidence", "ThreadStack",
    "Verdict", "apply_changes", "dump_report", "load_report", "seen_most_first",
]
