"""Analysis: algorithms over the records in ``models`` (which stay plain frozen data).

The wait-for graph and its proof, live and after the fact (``waitfor``: a deadlock proven
from the calls, a byte-stream reader of the traces), sequence matching across ranks
(``sequences``: where ranks' collectives parted), the straggler statistics
(``stragglers``), replica groups from how ranks communicate (``replicas``), the forward
passes' guards found in the user's source (``forwards``), distances between fingerprints
(``distance``) and per-step compute times (``timing``).

It imports only ``models`` (and no torch): checks, the launcher's watch, the in-rank watch
and the reports all read the same analysis.
"""
